# queen: the two commands are `make run` and `make test`.
GO ?= go
DATA ?= ./data

.PHONY: run cluster build test test-pg18 test-short vet fmt fuzz bench bench-scale bench-long-push bench-memory bench-sink bench-source bench-stages clean

## run: start one broker on its embedded storage (HTTP :6632, data in ./data)
run:
	$(GO) run ./cmd/queen serve --data-dir $(DATA)

## cluster: three local nodes (HTTP 6632/6642/6652, data in ./data/n1..n3; ./bin/queen dev-cluster -base-port N for others); Ctrl-C stops them
cluster:
	$(GO) build -o bin/queen ./cmd/queen && ./bin/queen dev-cluster -data $(DATA)

## build: build the queen binary into ./bin
build:
	$(GO) build -o bin/queen ./cmd/queen

## test: everything CI runs: format check, vet, the whole suite with -race
test: vet
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bench/*')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) test -race -count=1 -timeout 20m ./cmd/... ./internal/...
	@# The process-level suites run one after the other: each loads the two
	@# cores with real servers, and their timing checks should not share them.
	$(GO) test -race -count=1 -p 1 -timeout 20m ./tests/...
	@# The benchmark is its own module (it builds NATS); its tests check its
	@# drivers and decoders against fakes, not the numbers.
	cd bench && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m ./...

## test-pg18: the PostgreSQL-backed suites against PostgreSQL 18 instead of 17
test-pg18:
	QUEEN_TEST_PG_VERSION=18 $(GO) test -race -count=1 -p 1 -timeout 20m ./internal/pgtest/... ./internal/pgsink/... ./internal/pgsource/... ./internal/connector/... ./tests/...

## test-short: a quick run (fewer crash trials)
test-short:
	$(GO) test -short -count=1 ./...

vet:
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

## fuzz: run each fuzz target for a short while
fuzz:
	$(GO) test ./internal/state/ -run '^$$' -fuzz FuzzDecodeEntry -fuzztime 20s
	$(GO) test ./internal/state/ -run '^$$' -fuzz FuzzDecodeCursor -fuzztime 20s
	$(GO) test ./internal/httpapi/ -run '^$$' -fuzz FuzzDecodePush -fuzztime 20s
	$(GO) test ./internal/httpapi/ -run '^$$' -fuzz FuzzDecodeAck -fuzztime 20s
	$(GO) test ./internal/httpapi/ -run '^$$' -fuzz FuzzDecodeTransaction -fuzztime 20s
	$(GO) test ./internal/state/ -run '^$$' -fuzz FuzzDecodeTxn -fuzztime 20s
	$(GO) test ./internal/state/ -run '^$$' -fuzz FuzzDecodeKV -fuzztime 20s
	$(GO) test ./internal/auth/ -run '^$$' -fuzz FuzzAuthenticate -fuzztime 20s
	$(GO) test ./internal/jsonenc/ -run '^$$' -fuzz FuzzAppendString -fuzztime 20s
	$(GO) test ./internal/pgsource/ -run '^$$' -fuzz FuzzDecodeChange -fuzztime 20s

## bench: queen against NATS JetStream side by side (see bench/README.md)
bench:
	cd bench && $(GO) run .

## bench-source: the PostgreSQL source against COPY and pg_recvlogical on this machine (QUEEN_BENCH_ROWS, default 200000)
bench-source:
	QUEEN_BENCH_SOURCE=1 $(GO) test -count=1 -v -timeout 30m -run '^TestBenchSource$$' ./internal/pgsource/

## bench-scale: push and pop over 100 vs 1,000,000 partitions (order 100, 1M, 1M, 100), and the ratio
bench-scale:
	$(GO) test ./internal/broker/ -run '^$$' -bench BenchmarkPartitionScale -benchtime 5000x -timeout 30m

## bench-long-push: a 60 s push in-process (QUEEN_BENCH_PUSH_SECONDS): msgs/s per 10 s window, and the bytes each stage writes per payload byte
bench-long-push:
	$(GO) test ./internal/broker/ -run '^$$' -bench BenchmarkLongPush -benchtime 1x -timeout 15m

## bench-memory: the real binary pushes and then consumes 10 million messages; its peak and final RSS
bench-memory:
	cd bench && $(GO) run . -systems queen -only memory

## bench-sink: the PostgreSQL sink's rows/s (append, upsert; 1 and 4 workers) against COPY, and push->row latency
bench-sink:
	$(GO) test ./internal/pgsink/ -run '^$$' -bench BenchmarkSink -benchtime 1x -timeout 30m

## bench-stages: where a push and a pop+ack spend their time, stage by stage, on 1 and 3 nodes (tests/stages; QUEEN_STAGES_SECONDS, _CLIENTS, _NODES, _OVERHEAD)
bench-stages:
	$(GO) test ./tests/stages/ -run '^$$' -bench BenchmarkStages -benchtime 1x -timeout 30m

clean:
	rm -rf bin $(DATA)
