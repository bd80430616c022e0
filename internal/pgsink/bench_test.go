package pgsink

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/budget"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

// benchRow is the i-th row as a message of about 200 bytes.
func benchRow(i int) string {
	return fmt.Sprintf(`{"id":%d,"customer":"customer-%06d","amount":"%d.%02d","status":"new","region":"eu-west","note":"%s"}`,
		i, i%100000, i%10000, i%100, pad[:90])
}

const benchTable = `(id bigint %s, customer text, amount numeric(12,2), status text, region text, note text)`

// BenchmarkSink measures the sink's rows/s in append and upsert mode (1 and
// 4 workers, batch 500) against PostgreSQL's own COPY of the same rows, and
// the push-to-row latency at 5,000 messages/s, each with durability
// barriers and, side by side, with a flush per batch (syncEach). It prints
// a table; run it with `make bench-sink`. PostgreSQL runs with fsync and
// synchronous_commit on, as a production server would, and the broker with
// the binary's default memory budget. Each case is measured twice in one
// run: from the sink's start against a COPY on a new connection, and over
// a later window (steady) against a COPY on a connection that has copied
// before.
func BenchmarkSink(b *testing.B) {
	const n = 100000
	// QUEEN_BENCH_HUGE_PAGES=on: PostgreSQL's shared memory in huge pages
	// (needs vm.nr_hugepages of at least 150), so that a backend's first
	// touches of the shared buffers cost a fault per 2 MiB, not per 4 KiB.
	hugePages := cmp.Or(os.Getenv("QUEEN_BENCH_HUGE_PAGES"), "try")
	pg := pgtest.Private(b, pgtest.Options{Settings: map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "shared_buffers": "256MB", "huge_pages": hugePages}})
	db := pg.URL(pg.NewDatabase(b))
	ctx := context.Background()
	// Each run sinks (warm+1)·n rows: the first n from the sink's start
	// (cold: a new broker whose memtables, block cache and heap grow page by
	// page, new connections whose backends map PostgreSQL's shared memory
	// page by page), and the last n (steady).
	if os.Getenv("QUEEN_BENCH_TEXT_COPY") != "" {
		copyTextOnly = true // QUEEN_BENCH_TEXT_COPY=1: every append run in COPY's text format, as before binary COPY
		defer func() { copyTextOnly = false }()
	}
	warm := 4 // QUEEN_BENCH_WARM=k: the steady window is rows k·n to (k+1)·n
	if v, err := strconv.Atoi(os.Getenv("QUEEN_BENCH_WARM")); err == nil && v > 0 {
		warm = v
	}
	rows := make([]string, (warm+1)*n)
	for i := range rows {
		rows[i] = benchRow(i)
	}
	// COPY: the same rows as COPY text, one statement, into a table like
	// the sink's (no key for append, a primary key for upsert).
	var sb strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&sb, "%d\tcustomer-%06d\t%d.%02d\tnew\teu-west\t%s\n", i, i%100000, i%10000, i%100, pad[:90])
	}
	copyText := sb.String()
	copyLines := strings.SplitAfter(copyText, "\n")
	// copyRate is COPY of the n rows into a fresh table shaped like the
	// sink's: in one statement (chunk 0), or in transactions of chunk rows,
	// the sink's batch size, each committed. Cold, it connects first, as
	// the sink's start does. Warm, it goes through one connection kept for
	// the whole benchmark and warmed by a COPY before the first measured
	// one: its backend has mapped the shared buffers the dropped table
	// gives back, as a long-lived backend has. Each first touch of a page
	// costs about 11 µs on this machine, and a cold COPY of 100,000 rows
	// takes thousands of them (docs/benchmarks.md, "Session 22").
	copyPGSecs := map[int]float64{} // PostgreSQL's CPU seconds per 100,000 rows of the last cold copyRate, by chunk
	warmConn, err := pgx.Connect(ctx, db)
	if err != nil {
		b.Fatal(err)
	}
	defer warmConn.Close(ctx)
	copyRate := func(key string, chunk int, warm bool) float64 {
		exec(b, db, "DROP TABLE IF EXISTS copied", fmt.Sprintf("CREATE TABLE copied "+benchTable, key))
		conn := warmConn
		if !warm {
			c, err := pgx.Connect(ctx, db)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(ctx)
			conn = c
		}
		var parts []string
		if chunk == 0 {
			parts = []string{copyText}
		} else {
			for i := 0; i < n; i += chunk {
				parts = append(parts, strings.Join(copyLines[i:i+chunk], ""))
			}
		}
		pg0 := postgresCPU(b, db)
		start := time.Now()
		for _, part := range parts {
			if _, err := conn.PgConn().CopyFrom(ctx, strings.NewReader(part), "COPY copied FROM STDIN"); err != nil {
				b.Fatal(err)
			}
		}
		rate := n / time.Since(start).Seconds()
		if !warm {
			copyPGSecs[chunk] = (postgresCPU(b, db) - pg0).Seconds() * 1e5 / n
		}
		return rate
	}
	copyRate("", 0, true) // the warm connection's warm-up
	out := io.Writer(os.Stdout)
	reps := 3
	if v, err := strconv.Atoi(os.Getenv("QUEEN_BENCH_REPS")); err == nil && v > 0 {
		reps = v // QUEEN_BENCH_REPS=1: one run of each case, when profiling
	}
	fmt.Fprintf(out, "\nsink throughput, %d messages of ~%d bytes, batch 500, 16 partitions; each case %d times,\n", n, len(rows[0]), reps)
	fmt.Fprintf(out, "each sink run next to COPYs of the same rows into a table of the same shape (one COPY of all\n")
	fmt.Fprintf(out, "rows; COPYs of 500 rows, each its own transaction); medians. Each case runs with barriers\n")
	fmt.Fprintf(out, "(batches committed without a flush, one barrier per group) and, in the same rep, with a flush\n")
	fmt.Fprintf(out, "per batch (\"fsync each\", as before barriers). cores: CPU seconds of this process and of\n")
	fmt.Fprintf(out, "PostgreSQL over the wall time of the run; s/100k: the same CPU in seconds per 100,000 rows.\n")
	fmt.Fprintf(out, "Each run sinks %d rows: a line per case for the first %d, from the sink's start (a new broker\n", (warm+1)*n, n)
	fmt.Fprintf(out, "and new connections), against COPYs on a new connection; a \"steady\" line for the last %d,\n", n)
	fmt.Fprintf(out, "against one COPY on a connection that has copied before. PostgreSQL huge_pages=%q. A first\n", hugePages)
	fmt.Fprintf(out, "touch of a 4 KiB page (a minor page fault) costs %s on this machine.\n", pageFaultCost())
	fmt.Fprintf(out, "%-8s %-8s %-10s %12s %12s %8s %12s %8s %13s %13s\n", "mode", "workers", "commits", "sink rows/s", "COPY", "vs COPY", "COPY/500", "vs /500", "cores go+pg", "s/100k go+pg")
	e2e := benchModes()
	if os.Getenv("QUEEN_BENCH_TEXT_ARRAYS") != "" {
		textArraysOnly = true // QUEEN_BENCH_TEXT_ARRAYS=1: every upsert array in text format, as before binary text arrays
		defer func() { textArraysOnly = false }()
	}
	latencyOnly := os.Getenv("QUEEN_BENCH_LATENCY") != "" // QUEEN_BENCH_LATENCY=1: the latency lines alone
	if os.Getenv("QUEEN_BENCH_PGONLY") != "" || latencyOnly {
		e2e = nil // QUEEN_BENCH_PGONLY=1: the pg-only lines alone
	}
	variants := []bool{false, true} // syncEach
	if os.Getenv("QUEEN_BENCH_BARRIERS") != "" {
		variants = []bool{false} // QUEEN_BENCH_BARRIERS=1: without the fsync-each runs
	}
	variantName := map[bool]string{false: "barriers", true: "fsync each"}
	defer func() { syncEach = false }()
	for _, mode := range e2e {
		key := ""
		if mode == "upsert" {
			key = "PRIMARY KEY"
		}
		for _, workers := range benchWorkers() {
			type sample struct {
				ratios, ratios500, rates, copies, copies500, goCores, pgCores, goSecs, pgSecs, allocs, gcs, faults, runRatios, startMS []float64
				// the steady window: rows warm·n to (warm+1)·n, against the warm COPY
				stRatios, stWarmRatios, stRates, copiesWarm, stGoSecs, stPgSecs, stFaults, stPgFaults []float64
			}
			samples := map[bool]*sample{false: {}, true: {}}
			for rep := 0; rep < reps; rep++ {
				copyPS, copy500, copyWarm := copyRate(key, 0, false), copyRate(key, 500, false), copyRate(key, 0, true)
				for _, each := range variants {
					syncEach = each
					bk := benchBroker(b)
					queue := fmt.Sprintf("%s%d_%d_%t", mode, workers, rep, each)
					table := "t_" + queue
					exec(b, db, fmt.Sprintf("CREATE TABLE "+table+" "+benchTable, key))
					pushRows(b, bk, queue, rows, 16)
					spec := sinkSpec(queue, "public."+table, mode)
					spec.Batch, spec.Workers = 500, workers
					stopProfile := profileRun(b, fmt.Sprintf("%s%d_%d_%t", mode, workers, rep, each))
					var ms0, ms1 runtime.MemStats
					runtime.ReadMemStats(&ms0)
					cpu0, pg0, flt0 := processCPU(), postgresCPU(b, db), minorFaults()
					start := time.Now()
					r := startSink(b, bk, queue, db, spec)
					// Polled every millisecond: the sink's start (its first
					// connection and the table's checks, done when its phase
					// is running), its n-th row and its last. The COPYs'
					// rates leave out their connection; the rate from
					// running does too.
					var running time.Time
					var wall, cpu, pgCPU time.Duration
					var flt, pgFlt int64
					waitFor(b, "the first half of the rows", 10*time.Minute, func() error {
						for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
							if running.IsZero() && r.status.Get().Phase == connector.PhaseRunning {
								running = time.Now()
							}
							if r.metrics.applied.get() >= n {
								wall = time.Since(start)
								cpu, pgCPU, flt, pgFlt = processCPU()-cpu0, postgresCPU(b, db)-pg0, minorFaults()-flt0, postgresFaults(b, db)
								return nil
							}
						}
						return fmt.Errorf("applied %v", r.metrics.applied.get())
					})
					if running.IsZero() {
						running = start
					}
					runtime.ReadMemStats(&ms1)
					cpu1, pg1, flt1, half := cpu+cpu0, pgCPU+pg0, flt+flt0, start.Add(wall)
					pgFlt1 := pgFlt
					marked := warm == 1 // the steady window's start, when it is not the n-th row
					waitFor(b, "all rows", 10*time.Minute, func() error {
						for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
							a := r.metrics.applied.get()
							if !marked && a >= float64(warm*n) {
								marked, half = true, time.Now()
								cpu1, pg1, flt1, pgFlt1 = processCPU(), postgresCPU(b, db), minorFaults(), postgresFaults(b, db)
							}
							if a >= float64((warm+1)*n) {
								return nil
							}
						}
						return fmt.Errorf("applied %v", r.metrics.applied.get())
					})
					stWall := time.Since(half)
					stCPU, stPG, stFlt, stPgFlt := processCPU()-cpu1, postgresCPU(b, db)-pg1, minorFaults()-flt1, postgresFaults(b, db)-pgFlt1
					stopProfile()
					rate := n / wall.Seconds()
					r.stop()
					if testing.Verbose() {
						b.Logf("%s %d workers: %d batches in one round trip, %d of them pipelined, %d done again, %d next batches awaited; barriers: %d full, %d aged, %d with no next batch, %d of their own; %d groups left open on a bet, %d lost", mode, workers, r.sink.oneTrip.Load(), r.sink.pipelined.Load(), r.sink.redone.Load(), r.sink.awaited.Load(), r.sink.barrierFull.Load(), r.sink.barrierAge.Load(), r.sink.barrierIdle.Load(), r.sink.barrierOwn.Load(), r.sink.bets.Load(), r.sink.betsLost.Load())
					}
					if c := count(b, db, "SELECT count(*) FROM "+table); c != (warm+1)*n {
						b.Fatalf("%s: %d rows, want %d", table, c, (warm+1)*n)
					}
					bk.Close()
					exec(b, db, "DROP TABLE "+table)
					sm := samples[each]
					sm.ratios, sm.rates, sm.copies = append(sm.ratios, rate/copyPS), append(sm.rates, rate), append(sm.copies, copyPS)
					sm.ratios500, sm.copies500 = append(sm.ratios500, rate/copy500), append(sm.copies500, copy500)
					sm.goCores, sm.pgCores = append(sm.goCores, cpu.Seconds()/wall.Seconds()), append(sm.pgCores, pgCPU.Seconds()/wall.Seconds())
					sm.goSecs, sm.pgSecs = append(sm.goSecs, cpu.Seconds()*1e5/n), append(sm.pgSecs, pgCPU.Seconds()*1e5/n)
					sm.allocs = append(sm.allocs, float64(ms1.TotalAlloc-ms0.TotalAlloc)/n)
					sm.gcs = append(sm.gcs, float64(ms1.NumGC-ms0.NumGC)*1e5/n)
					sm.faults = append(sm.faults, float64(flt)*1e5/n)
					sm.runRatios = append(sm.runRatios, n/start.Add(wall).Sub(running).Seconds()/copyPS)
					sm.startMS = append(sm.startMS, float64(running.Sub(start).Microseconds())/1e3)
					stRate := n / stWall.Seconds()
					sm.stRatios, sm.stWarmRatios, sm.stRates = append(sm.stRatios, stRate/copyPS), append(sm.stWarmRatios, stRate/copyWarm), append(sm.stRates, stRate)
					sm.copiesWarm = append(sm.copiesWarm, copyWarm)
					sm.stGoSecs, sm.stPgSecs = append(sm.stGoSecs, stCPU.Seconds()*1e5/n), append(sm.stPgSecs, stPG.Seconds()*1e5/n)
					sm.stFaults, sm.stPgFaults = append(sm.stFaults, float64(stFlt)*1e5/n), append(sm.stPgFaults, float64(stPgFlt)*1e5/n)
				}
			}
			for _, each := range variants {
				sm := samples[each]
				fmt.Fprintf(out, "%-8s %-8d %-10s %12.0f %12.0f %7.2fx %12.0f %7.2fx %6.2f+%.2f %6.2f+%.2f   (ratios %s | %s; from running %.2fx, ratios %s, start %.0f ms; %.0f B/row, %.0f GCs/100k, %.0f page faults/100k)\n", mode, workers, variantName[each], median(sm.rates),
					median(sm.copies), median(sm.ratios), median(sm.copies500), median(sm.ratios500), median(sm.goCores), median(sm.pgCores),
					median(sm.goSecs), median(sm.pgSecs), fmtRatios(sm.ratios), fmtRatios(sm.ratios500), median(sm.runRatios), fmtRatios(sm.runRatios), median(sm.startMS), median(sm.allocs), median(sm.gcs), median(sm.faults))
				fmt.Fprintf(out, "%-8s %-8s %-10s %12.0f %12.0f %7.2fx %12s %8s %13s %6.2f+%.2f   (steady: rows %d to %d of the same run, against a warm COPY; ratios %s; %.2fx of the cold COPY; page faults/100k go %.0f, pg %.0f)\n", mode, fmt.Sprintf("%d steady", workers), variantName[each], median(sm.stRates),
					median(sm.copiesWarm), median(sm.stWarmRatios), "", "", "", median(sm.stGoSecs), median(sm.stPgSecs), warm*n, (warm+1)*n, fmtRatios(sm.stWarmRatios), median(sm.stRatios), median(sm.stFaults), median(sm.stPgFaults))
			}
		}
	}
	// The sink's PostgreSQL share: its transactions of 500 (progress rows
	// locked, the rows written, the offsets, COMMIT; a barrier per
	// maxPending) from one connection, with no broker; with the COPY path
	// and with every row through jsonb_populate_recordset, with barriers
	// and with a flush per batch, in turn, each run next to its COPYs.
	pgModes := benchModes()
	if os.Getenv("QUEEN_BENCH_E2E") != "" || latencyOnly {
		pgModes = nil // QUEEN_BENCH_E2E=1: the end-to-end lines alone
	}
	for _, mode := range pgModes {
		key := ""
		if mode == "upsert" {
			key = "PRIMARY KEY"
		}
		type sample struct{ rate, copyPS, copy500, pgSecs, copyPG, copy500PG []float64 }
		type variant struct {
			path string
			each bool
		}
		var vs []variant
		samples := map[variant]*sample{}
		paths := []string{"COPY", "COPY text", "COPY multi-insert", "COPY unpipelined", "populate"}
		if mode == "upsert" {
			paths = []string{"COPY", "COPY text arrays", "COPY unpipelined", "COPY staged unpipelined", "populate"}
		}
		if v := os.Getenv("QUEEN_BENCH_PATHS"); v != "" {
			paths = strings.Split(v, ",") // QUEEN_BENCH_PATHS=COPY: the pg-only lines of these paths alone
		}
		for _, path := range paths {
			for _, each := range variants {
				vs = append(vs, variant{path, each})
				samples[variant{path, each}] = &sample{}
			}
		}
		for rep := 0; rep < reps; rep++ {
			for _, v := range vs {
				copyPS, copy500 := copyRate(key, 0, false), copyRate(key, 500, false)
				syncEach = v.each
				rate, pgSecs := pgOnly(b, db, mode, key, v.path, rows[:n])
				sm := samples[v]
				sm.rate, sm.copyPS, sm.copy500 = append(sm.rate, rate), append(sm.copyPS, rate/copyPS), append(sm.copy500, rate/copy500)
				sm.pgSecs = append(sm.pgSecs, pgSecs)
				sm.copyPG, sm.copy500PG = append(sm.copyPG, copyPGSecs[0]), append(sm.copy500PG, copyPGSecs[500])
			}
		}
		for _, v := range vs {
			sm := samples[v]
			fmt.Fprintf(out, "%-8s %-8s %-10s %12.0f %12s %7.2fx %12s %7.2fx %13s %8s%.2f   (the sink's transactions alone, no broker, %s path; ratios %s | %s; pg s/100k of COPY %.2f, of COPYs of 500 %.2f)\n", mode, "pg only", variantName[v.each],
				median(sm.rate), "", median(sm.copyPS), "", median(sm.copy500), "", "pg ", median(sm.pgSecs), v.path, fmtRatios(sm.copyPS), fmtRatios(sm.copy500), median(sm.copyPG), median(sm.copy500PG))
		}
	}
	syncEach = false
	if os.Getenv("QUEEN_BENCH_PGONLY") != "" || os.Getenv("QUEEN_BENCH_E2E") != "" {
		return
	}
	// The broker's own share: the same pops and acks with no PostgreSQL.
	if !latencyOnly {
		bk := benchBroker(b)
		pushRows(b, bk, "popack", rows[:n], 16)
		start := time.Now()
		got := 0
		for got < n {
			resp, err := bk.Pop(ctx, broker.PopRequest{Tenant: "default", Queue: "popack", Group: "g", Batch: 500, Partitions: 500, SubscriptionMode: "all", LeaseSeconds: 60, Deliveries: true})
			if err != nil {
				b.Fatal(err)
			}
			// Acked as the sink acks: a partition's consecutive offsets
			// as one item (a run).
			var items []broker.AckItem
			for _, m := range resp.Delivered {
				if n := len(items); n > 0 && items[n-1].PartitionID == m.PartitionID && *items[n-1].Offset+max(items[n-1].Count, 1) == m.Offset {
					items[n-1].Count, items[n-1].TxID = max(items[n-1].Count, 1)+1, ""
					continue
				}
				off := m.Offset
				items = append(items, broker.AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Offset: &off, Group: "g", LeaseID: resp.LeaseID})
			}
			if len(items) > 0 {
				if _, err := bk.Ack(ctx, "default", items); err != nil {
					b.Fatal(err)
				}
			}
			got += len(resp.Delivered)
		}
		fmt.Fprintf(out, "%-17s %12.0f   (the broker's pop+ack of batches of 500, no PostgreSQL)\n", "pop+ack only", float64(n)/time.Since(start).Seconds())
		bk.Close()
	}
	// Latency: push at 5,000 messages/s for 10 s; each row's arrival time
	// (clock_timestamp() at insert) minus the push time in the message;
	// with barriers, then with a flush per batch.
	for _, each := range variants {
		syncEach = each
		bk := benchBroker(b)
		table := fmt.Sprintf("lat_%t", each)
		exec(b, db, `CREATE TABLE `+table+` (id bigint, pushed_at timestamptz, arrived timestamptz DEFAULT clock_timestamp())`)
		spec := sinkSpec(table, "public."+table, "append")
		r := startSink(b, bk, table, db, spec)
		const rate, secs, tick = 5000, 10, 10 * time.Millisecond
		start := time.Now()
		sent := 0
		for sent < rate*secs {
			due := int(time.Since(start) * rate / time.Second)
			var items []broker.PushItem
			for ; sent < due && sent < rate*secs; sent++ {
				items = append(items, broker.PushItem{Queue: table, Partition: fmt.Sprintf("p%d", sent%16),
					Payload: []byte(fmt.Sprintf(`{"id":%d,"pushed_at":"%s","note":"%s"}`, sent, time.Now().UTC().Format(time.RFC3339Nano), pad[:120]))})
			}
			if len(items) > 0 {
				if _, err := bk.Push(ctx, "default", items); err != nil {
					b.Fatal(err)
				}
			}
			time.Sleep(tick)
		}
		waitFor(b, "latency rows", 2*time.Minute, func() error {
			if r.metrics.applied.get() < rate*secs {
				return fmt.Errorf("applied %v", r.metrics.applied.get())
			}
			return nil
		})
		r.stop()
		bk.Close()
		pct := query(b, db, `SELECT round(1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY arrived - pushed_at))::numeric, 1),
		round(1000 * extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY arrived - pushed_at))::numeric, 1) FROM `+table)
		fmt.Fprintf(out, "push->row latency at %d messages/s for %d s (append, 1 worker, 16 partitions, %s): p50 | p99 ms = %s\n", rate, secs, variantName[each], pct[0])
	}
}

// pgOnly replays the sink's transactions of the rows (batches of 500,
// 16 partitions, a durability barrier after every maxPending unless
// syncEach) from one connection, with the COPY path or with every row
// through populate, and returns the rows/s.
func pgOnly(b *testing.B, db, mode, key, path string, rows []string) (float64, float64) {
	ctx := context.Background()
	n := len(rows)
	table := "t_pgonly_" + mode
	exec(b, db, "DROP TABLE IF EXISTS "+table, fmt.Sprintf("CREATE TABLE "+table+" "+benchTable, key))
	env, _ := envFor(nil, "pgonly-"+mode, connFor(db), sinkSpec("x", "public."+table, mode))
	env.Broker = &broker.Broker{}
	rn, err := New(env)
	if err != nil {
		b.Fatal(err)
	}
	sk := rn.(*sink)
	conn, p, err := sk.connect(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DELETE FROM queen.sink_progress WHERE sink = $1", sk.name); err != nil {
		b.Fatal(err)
	}
	if path == "populate" {
		p.copy = nil
	}
	noPipeline = strings.HasSuffix(path, "unpipelined")
	copyMultiInsert = path == "COPY multi-insert" // every COPY a multi-insert, as before rowByRow
	if path == "COPY text" {
		copyTextOnly = true // every run in COPY's text format, as before binary COPY
		defer func() { copyTextOnly = false }()
	}
	if path == "COPY staged unpipelined" && p.copy != nil {
		p.copy.unnest = false // upserts through the staging table
	}
	if path == "COPY text arrays" {
		textArraysOnly = true // every upsert array in text format, as before
		defer func() { textArraysOnly = false }()
	}
	defer func() { noPipeline, copyMultiInsert = false, false }()
	w := &worker{s: sk, conn: conn, plan: p, stmts: map[string]string{}}
	pg0 := postgresCPU(b, db)
	start := time.Now()
	for i := 0; i < n; i += 500 {
		msgs := make([]broker.Delivery, 500)
		for j := range msgs {
			msgs[j] = broker.Delivery{Partition: fmt.Sprintf("p%d", (i/500)%16), PartitionID: uint64((i/500)%16 + 1), Offset: uint64(i/16 + j), Payload: []byte(rows[i+j]), Attempt: 1}
		}
		// The next batch is always ready here, so a batch closes its
		// group (commits as the barrier) when maxPending are pending, and
		// the last one is made durable with a barrier of its own. A batch
		// is pipelined behind the one before when it can be, as a
		// worker's are.
		w.ahead = &broker.PopResponse{}
		resp := &broker.PopResponse{Delivered: msgs}
		items, parts := w.group(msgs)
		if err := w.decode(ctx, items, parts); err != nil {
			b.Fatal(err)
		}
		pre := &decodedBatch{items: items, parts: parts, ok: true}
		if w.send(ctx, resp, pre, nil) {
			if err := w.collect(ctx, maxFlights-1); err != nil {
				b.Fatalf("collect: %v", err)
			}
		} else {
			if err := w.drain(ctx); err != nil {
				b.Fatalf("drain: %v", err)
			}
			res, err := w.apply(ctx, msgs, pre)
			if err != nil || res.applied != 500 {
				b.Fatalf("apply: %v %+v", err, res)
			}
			w.pending = append(w.pending, &pending{resp: resp, res: res, pc: conn.PgConn(), durable: w.flushed})
		}
		if i+500 >= n {
			if err := w.drain(ctx); err != nil {
				b.Fatalf("drain: %v", err)
			}
		}
		if np := len(w.pending); np > 0 && w.pending[np-1].durable {
			w.pending = nil
		}
		if i+500 >= n && len(w.pending) > 0 && !syncEach {
			if err := w.barrier(ctx, w.pending); err != nil {
				b.Fatalf("barrier: %v", err)
			}
		}
	}
	for _, p := range w.pending {
		if p.res.applied != 500 {
			b.Fatalf("a batch applied %d", p.res.applied)
		}
	}
	rate := float64(n) / time.Since(start).Seconds()
	pgSecs := (postgresCPU(b, db) - pg0).Seconds() * 1e5 / float64(n)
	if testing.Verbose() {
		b.Logf("%s %s path: %d batches in one round trip, %d of them pipelined", mode, path, sk.oneTrip.Load(), sk.pipelined.Load())
	}
	if c := sk.copied.Load(); (path != "populate") != (c == int64(n)) {
		b.Fatalf("%s path: %d rows copied", path, c)
	}
	return rate, pgSecs
}

// profileRun starts a CPU profile and an execution trace of one sink run
// when QUEEN_BENCH_PROFILE names a directory (files <dir>/<run>.cpu and
// <dir>/<run>.trace), and returns what stops them.
func profileRun(b *testing.B, run string) func() {
	dir := os.Getenv("QUEEN_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	cf, err := os.Create(filepath.Join(dir, run+".cpu"))
	if err != nil {
		b.Fatal(err)
	}
	tf, err := os.Create(filepath.Join(dir, run+".trace"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(cf); err != nil {
		b.Fatal(err)
	}
	if err := trace.Start(tf); err != nil {
		b.Fatal(err)
	}
	return func() {
		trace.Stop()
		pprof.StopCPUProfile()
		cf.Close()
		tf.Close()
	}
}

// minorFaults is the number of minor page faults this process took so far:
// first touches of memory the kernel has to map (and zero).
func minorFaults() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Minflt
}

// processCPU is the CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// postgresCPU is the CPU time the server of db used so far: its
// postmaster's own and that of the children it reaped, plus its live
// children's (from /proc).
func postgresCPU(b testing.TB, db string) time.Duration {
	pm := postmasterPID(b, db)
	// A live process's CPU in nanoseconds (schedstat's first field), not
	// in the 10 ms ticks of stat, which lose up to a tick a process per
	// reading; the exited children's only in ticks (cutime, cstime).
	sched := func(pid int) (time.Duration, bool) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(st))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		return time.Duration(ns), err == nil
	}
	stat := func(pid int) ([4]int64, int, bool) {
		var v [4]int64
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return v, 0, false
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
		for i := range v {
			v[i], _ = strconv.ParseInt(f[11+i], 10, 64) // utime stime cutime cstime
		}
		ppid, _ := strconv.Atoi(f[1])
		return v, ppid, true
	}
	var total time.Duration
	if v, _, ok := stat(pm); ok {
		total = time.Duration(v[2]+v[3]) * time.Second / 100 // USER_HZ
	}
	if d, ok := sched(pm); ok {
		total += d
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := stat(pid); ok && ppid == pm {
			if d, ok := sched(pid); ok {
				total += d
			}
		}
	}
	return total
}

// pageFaultCost is what a first touch of a page costs this process: the
// time to write one byte into each 4 KiB page of a new 64 MiB mapping,
// per page (the kernel maps and zeroes each on its fault), the least of
// three tries.
func pageFaultCost() time.Duration {
	const size, page = 64 << 20, 4096
	best := time.Duration(-1)
	for range 3 {
		m, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return -1
		}
		start := time.Now()
		for i := 0; i < size; i += page {
			m[i] = 1
		}
		d := time.Since(start) / (size / page)
		syscall.Munmap(m)
		if best < 0 || d < best {
			best = d
		}
	}
	return best
}

// benchBroker opens a broker with the memory budget the binary gives a
// node by default, as a user runs it.
func benchBroker(b *testing.B) *broker.Broker {
	b.Helper()
	mem := budget.For(budget.Default)
	return openBrokerWith(b, cluster.Config{CacheBytes: mem.CacheBytes, MemTableBytes: mem.MemTableBytes, DedupBytes: int(mem.DedupBytes)})
}

// postgresFaults is the number of minor page faults the server of db took
// so far: its postmaster's, its reaped children's and its live children's.
// A backend takes one the first time it touches each page of the shared
// buffers, however long the server has run.
func postgresFaults(b testing.TB, db string) int64 {
	pm := postmasterPID(b, db)
	fields := func(pid int) ([]string, bool) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil, false
		}
		return strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:])), true
	}
	field := func(f []string, i int) int64 {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		return v
	}
	var total int64
	if f, ok := fields(pm); ok {
		total = field(f, 7) + field(f, 8) // minflt cminflt
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, ok := fields(pid); ok && f[1] == strconv.Itoa(pm) {
			total += field(f, 7)
		}
	}
	return total
}

// pushRows pushes rows into queue over parts partitions.
func pushRows(b testing.TB, bk *broker.Broker, queue string, rows []string, parts int) {
	var items []broker.PushItem
	for i, r := range rows {
		items = append(items, broker.PushItem{Queue: queue, Partition: fmt.Sprintf("p%d", i%parts), Payload: []byte(r)})
		if len(items) == 1000 || i == len(rows)-1 {
			if _, err := bk.Push(context.Background(), "default", items); err != nil {
				b.Fatal(err)
			}
			items = items[:0]
		}
	}
}

// benchModes and benchWorkers narrow the run (QUEEN_BENCH_MODES=append,
// QUEEN_BENCH_WORKERS=1) when profiling one case.
func benchModes() []string {
	if v := os.Getenv("QUEEN_BENCH_MODES"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"append", "upsert"}
}

func benchWorkers() []int {
	if v := os.Getenv("QUEEN_BENCH_WORKERS"); v != "" {
		var out []int
		for _, s := range strings.Split(v, ",") {
			var n int
			fmt.Sscan(s, &n)
			out = append(out, n)
		}
		return out
	}
	return []int{1, 4}
}

func median(v []float64) float64 {
	c := append([]float64(nil), v...)
	sort.Float64s(c)
	return c[len(c)/2]
}

func fmtRatios(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, " ")
}
