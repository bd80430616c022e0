// Command bench compares queen with NATS JetStream on this machine.
//
// It starts NATS JetStream in-process twice (default settings, and with
// sync_interval: always) and the queen broker as a child process (or uses a
// running one with -queen-url), runs the same scenarios against each and
// prints msgs/s, p50/p99 latency and the queen/JetStream ratios.
//
// Run it as: cd bench && go run . [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	systems  []string
	only     map[string]bool
	quick    bool
	markdown bool
	verbose  bool

	clients    []int // closed-loop clients of each push, pop+ack and fan-out run
	pushIDs    bool
	pushDur    time.Duration
	pushWindow time.Duration // 0: no per-window rates
	warmup     time.Duration
	batches    []int
	sizes      []int
	partitions []int

	prefill        int
	consPartitions int
	popBatch       int
	popPartitions  int
	fanGroups      int
	consumeTimeout time.Duration

	latRate int
	latDur  time.Duration
	latAck  string // latencyAck*: how the latency scenario's consumer acknowledges

	memoryMessages int

	queenURL          string
	queenSrc          string
	queenBin          string
	queenClient       string
	queenStartTimeout time.Duration
	tmpDir            string
	keep              bool
	jsFastPrefill     bool
	cpuProfile        string

	runID string
}

const (
	sysJS     = "js"
	sysJSSync = "js-sync"
	sysQueen  = "queen"
	// sysQueenInterval is queen started with QUEEN_FSYNC=interval.
	sysQueenInterval = "queen-interval"
)

// The latency scenario's consumers (-latency-ack).
const (
	latencyAckExplicit = "explicit"
	latencyAckNone     = "none"
)

// fillProducers push the pre-filled queue (not measured).
const fillProducers = 4

func isQueen(sys string) bool { return sys == sysQueen || sys == sysQueenInterval }

var allScenarioGroups = []string{"push", "popack", "fanout", "latency"}

// optionalScenarioGroups run only when -only names them.
var optionalScenarioGroups = []string{"memory"}

func main() {
	if spec := os.Getenv(natsChildEnv); spec != "" {
		if err := runNATSChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench: NATS child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	cfg := &config{}
	var systems, only, batches, sizes, parts, clients string
	fs.StringVar(&systems, "systems", "js,js-sync,queen,queen-interval", "systems to run: js (JetStream defaults, no fsync per write), js-sync (JetStream sync_interval: always), queen (QUEEN_FSYNC=always: fsync before every reply), queen-interval (QUEEN_FSYNC=interval: fsync every 100 ms); with -queen-url the default is js,js-sync,queen")
	fs.StringVar(&only, "only", "", "comma list of scenarios to run: "+strings.Join(allScenarioGroups, ",")+" (default: all)")
	fs.BoolVar(&cfg.quick, "quick", false, "tiny smoke run (seconds, not minutes); explicit flags still override")
	fs.BoolVar(&cfg.markdown, "markdown", false, "print the result tables as markdown")
	fs.BoolVar(&cfg.verbose, "v", false, "verbose progress (debug logs)")

	fs.StringVar(&clients, "clients", "4,16,64", "closed-loop client counts: each push, pop+ack and fan-out scenario runs once with each (producers in push, consumers of the one group in pop+ack, spread over the groups in fan-out)")
	fs.DurationVar(&cfg.pushDur, "push-duration", 1500*time.Millisecond, "measured time of each push variant")
	fs.DurationVar(&cfg.pushWindow, "push-window", 0, "also report each push variant's msgs/s per window of this length, and the whole run's rate against the first window's (e.g. -push-duration 60s -push-window 10s: does a long push slow down?)")
	fs.DurationVar(&cfg.warmup, "warmup", 500*time.Millisecond, "unmeasured warm-up before each push variant and the latency scenario")
	fs.StringVar(&batches, "push-batches", "1,10,100", "push batch sizes (messages per request)")
	fs.StringVar(&sizes, "push-sizes", "30,1024", "push payload sizes in bytes")
	fs.StringVar(&parts, "push-partitions", "1,100", "push partition counts (NATS: subjects bench.<p>)")
	fs.BoolVar(&cfg.pushIDs, "push-ids", false, "every pushed message carries a client id, as Queen's client libraries send: a UUIDv7 transactionId per item for queen, a Nats-Msg-Id (JetStream's dedup) for JetStream")

	fs.IntVar(&cfg.prefill, "prefill", 100000, "messages pre-filled for pop+ack and fan-out")
	fs.IntVar(&cfg.consPartitions, "consume-partitions", 100, "partitions (subjects) the pre-filled queue is spread over")
	fs.IntVar(&cfg.popBatch, "pop-batch", 100, "messages per pop / Fetch")
	fs.IntVar(&cfg.popPartitions, "pop-partitions", 10, "queen: partitions= per pop")
	fs.IntVar(&cfg.fanGroups, "fanout-groups", 5, "consumer groups (NATS durables) in the fan-out scenario, one consumer each")
	fs.DurationVar(&cfg.consumeTimeout, "consume-timeout", 120*time.Second, "give up on a consume scenario after this long")

	fs.IntVar(&cfg.latRate, "latency-rate", 1000, "messages per second in the push-to-consumer latency scenario")
	fs.DurationVar(&cfg.latDur, "latency-duration", 5*time.Second, "measured time of the latency scenario")
	fs.StringVar(&cfg.latAck, "latency-ack", latencyAckExplicit, "the latency scenario's consumer: explicit (queen leases and acknowledges each batch after taking its receive times; JetStream AckExplicit, each message acked on receipt) or none (queen autoAck=true, durable before its reply; JetStream AckNone)")

	fs.IntVar(&cfg.memoryMessages, "memory-messages", 10_000_000, "messages (30 B, over -consume-partitions partitions) the memory scenario pushes and then consumes while it samples the server's RSS; the scenario runs only when -only names it")
	fs.StringVar(&cfg.queenURL, "queen-url", "", "use this running queen (e.g. http://127.0.0.1:6632) instead of building and starting one; a comma list of a cluster's nodes spreads producers and consumers over them")
	fs.StringVar(&cfg.queenSrc, "queen-src", "..", "directory of the queen module to build ./cmd/queen from")
	fs.StringVar(&cfg.queenBin, "queen-bin", "", "start this queen binary instead of building one from -queen-src (to compare builds side by side)")
	fs.StringVar(&cfg.queenClient, "queen-client", "std", "queen's client: std (Go's net/http, as Queen's Go client uses) or raw (one kept-alive connection per producer or consumer, a request written in one call, no per-request objects: closer to the CPU nats.go spends)")
	fs.DurationVar(&cfg.queenStartTimeout, "queen-start-timeout", 60*time.Second, "how long to wait for queen's /health")
	fs.StringVar(&cfg.tmpDir, "tmpdir", "", "parent of the temporary data directories (default: the system temp dir)")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the temporary data directories and queen's log")
	fs.BoolVar(&cfg.jsFastPrefill, "js-sync-fast-prefill", true, "js-sync: fill the consume stream with a non-syncing server on the same store, then restart with sync always (filling at one fsync per message takes minutes; the fill is not measured)")

	fs.BoolVar(&natsInChild, "js-process", false, "run the NATS server in a child process, so that JetStream's client and server cross processes as queen's do (default: in the bench process)")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process (with the in-process NATS server) to this file")

	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.quick {
		q := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		q("push-duration", func() { cfg.pushDur = 200 * time.Millisecond })
		q("warmup", func() { cfg.warmup = 100 * time.Millisecond })
		q("prefill", func() { cfg.prefill = 3000 })
		q("latency-rate", func() { cfg.latRate = 200 })
		q("latency-duration", func() { cfg.latDur = time.Second })
		q("consume-timeout", func() { cfg.consumeTimeout = 30 * time.Second })
	}

	var err error
	if cfg.batches, err = parseInts(batches); err != nil {
		return nil, fmt.Errorf("-push-batches: %w", err)
	}
	if cfg.sizes, err = parseInts(sizes); err != nil {
		return nil, fmt.Errorf("-push-sizes: %w", err)
	}
	for _, s := range cfg.sizes {
		if s < 16 {
			return nil, fmt.Errorf("-push-sizes: %d is below the 16 bytes a JSON payload needs here", s)
		}
	}
	if cfg.partitions, err = parseInts(parts); err != nil {
		return nil, fmt.Errorf("-push-partitions: %w", err)
	}
	if cfg.clients, err = parseInts(clients); err != nil {
		return nil, fmt.Errorf("-clients: %w", err)
	}
	for name, v := range map[string]int{"prefill": cfg.prefill,
		"consume-partitions": cfg.consPartitions, "pop-batch": cfg.popBatch, "pop-partitions": cfg.popPartitions,
		"fanout-groups": cfg.fanGroups, "latency-rate": cfg.latRate, "memory-messages": cfg.memoryMessages} {
		if v <= 0 {
			return nil, fmt.Errorf("-%s must be positive, got %d", name, v)
		}
	}
	if cfg.pushDur <= 0 || cfg.latDur <= 0 || cfg.warmup < 0 {
		return nil, errors.New("durations must be positive")
	}
	if cfg.latAck != latencyAckExplicit && cfg.latAck != latencyAckNone {
		return nil, fmt.Errorf("-latency-ack: want %s or %s, got %q", latencyAckExplicit, latencyAckNone, cfg.latAck)
	}
	if cfg.queenClient != "std" && cfg.queenClient != "raw" {
		return nil, fmt.Errorf("-queen-client: want std or raw, got %q", cfg.queenClient)
	}
	if cfg.queenClient == "raw" {
		for u := range strings.SplitSeq(cfg.queenURL, ",") {
			if u = strings.TrimRight(strings.TrimSpace(u), "/"); u != "" {
				if err := checkRawBase(u); err != nil {
					return nil, err
				}
			}
		}
	}
	if cfg.queenURL != "" && !set["systems"] {
		systems = "js,js-sync,queen"
	}
	for s := range strings.SplitSeq(systems, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case sysJS, sysJSSync, sysQueen, sysQueenInterval:
			cfg.systems = append(cfg.systems, s)
		case "":
		default:
			return nil, fmt.Errorf("-systems: unknown system %q (want js, js-sync, queen, queen-interval)", s)
		}
		if s == sysQueenInterval && cfg.queenURL != "" {
			return nil, errors.New("-systems queen-interval starts its own server with QUEEN_FSYNC=interval; with -queen-url, list queen and start that server with the setting you want to measure")
		}
	}
	if len(cfg.systems) == 0 {
		return nil, errors.New("-systems: nothing selected")
	}
	cfg.only = map[string]bool{}
	for s := range strings.SplitSeq(only, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		switch s {
		case "pop+ack", "pop":
			s = "popack"
		case "fan-out":
			s = "fanout"
		}
		found := false
		for _, g := range append(allScenarioGroups, optionalScenarioGroups...) {
			found = found || g == s
		}
		if !found {
			return nil, fmt.Errorf("-only: unknown scenario %q (want %s)", s, strings.Join(append(allScenarioGroups, optionalScenarioGroups...), ","))
		}
		cfg.only[s] = true
	}
	if len(cfg.only) == 0 {
		for _, g := range allScenarioGroups {
			cfg.only[g] = true
		}
	}
	cfg.runID = strconv.FormatInt(time.Now().Unix(), 36)
	return cfg, nil
}

type scenarioKind int

const (
	kindPush scenarioKind = iota
	kindPopAck
	kindFanOut
	kindLatency
	kindMemory
)

type scenario struct {
	kind       scenarioKind
	name       string
	batch      int
	size       int
	partitions int
	ids        bool // each message carries a client id (-push-ids)
	clients    int  // closed-loop clients (push, pop+ack, fan-out)
}

func (cfg *config) scenarios() []scenario {
	// Every push runs before the consume scenarios: on the JetStream side
	// a push recreates the one stream of the bench's subjects, which would
	// drop the pre-filled one.
	var out []scenario
	if cfg.only["push"] {
		for _, c := range cfg.clients {
			for _, p := range cfg.partitions {
				for _, sz := range cfg.sizes {
					for _, b := range cfg.batches {
						sc := scenario{kind: kindPush, batch: b, size: sz, partitions: p, ids: cfg.pushIDs, clients: c,
							name: fmt.Sprintf("push b=%d %s %dp c=%d", b, fmtSize(sz), p, c)}
						if sc.ids {
							sc.name += " ids"
						}
						out = append(out, sc)
					}
				}
			}
		}
	}
	for _, c := range cfg.clients {
		if cfg.only["popack"] {
			out = append(out, scenario{kind: kindPopAck, clients: c, name: fmt.Sprintf("pop+ack b=%d c=%d", cfg.popBatch, c)})
		}
		if cfg.only["fanout"] {
			out = append(out, scenario{kind: kindFanOut, clients: c, name: fmt.Sprintf("fan-out %d groups c=%d", cfg.fanGroups, c)})
		}
	}
	if cfg.only["latency"] {
		out = append(out, scenario{kind: kindLatency, name: fmt.Sprintf("push→consumer latency %d/s", cfg.latRate)})
	}
	if cfg.only["memory"] {
		out = append(out, scenario{kind: kindMemory, clients: fillProducers, name: fmt.Sprintf("memory: %s msgs pushed, then consumed", fmtRate(float64(cfg.memoryMessages)))})
	}
	return out
}

func fmtSize(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%dKiB", n/1024)
	}
	return fmt.Sprintf("%dB", n)
}

// system is one broker under test.
type system interface {
	name() string
	// serverPID is the broker's process id when it runs as its own process, else 0.
	serverPID() int
	push(ctx context.Context, sc scenario, m *cpuMeter) result
	// prefill creates the queue/stream that pop+ack and fan-out read.
	prefill(ctx context.Context) error
	// popAck and fanOut read the pre-filled queue with groups of their own
	// (named after sc.clients), so each client count reads all of it.
	popAck(ctx context.Context, sc scenario, m *cpuMeter) result
	fanOut(ctx context.Context, sc scenario, m *cpuMeter) result
	latency(ctx context.Context, m *cpuMeter) result
	// memory pushes and consumes -memory-messages while it samples the
	// server's resident memory (memory.go).
	memory(ctx context.Context, sc scenario, m *cpuMeter) result
	close() error
}

func run() error {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	level := slog.LevelInfo
	if cfg.verbose {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))

	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	scs := cfg.scenarios()
	results := map[string]map[string]*result{} // scenario name -> system -> result
	for _, sc := range scs {
		results[sc.name] = map[string]*result{}
	}
	info := map[string]string{"load-start": loadAvg(), "fsync": fsyncFloor(cfg.tmpDir)}

	start := time.Now()
	for _, sysName := range cfg.systems {
		if ctx.Err() != nil {
			break
		}
		runSystem(ctx, cfg, sysName, scs, results, info)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	printReport(os.Stdout, cfg, scs, results, info, time.Since(start))
	return nil
}

func runSystem(ctx context.Context, cfg *config, sysName string, scs []scenario, results map[string]map[string]*result, info map[string]string) {
	slog.Info("starting system", "system", sysName)
	var (
		sys system
		err error
	)
	switch sysName {
	case sysJS:
		sys, err = newNATSSystem(ctx, cfg, false)
	case sysJSSync:
		sys, err = newNATSSystem(ctx, cfg, true)
	case sysQueen, sysQueenInterval:
		var q *queenSystem
		q, err = newQueenSystem(ctx, cfg, sysName)
		if err == nil {
			sys = q
			info["queen"] = q.version
		}
	}
	if err != nil {
		slog.Error("system did not start", "system", sysName, "err", err)
		for _, sc := range scs {
			results[sc.name][sysName] = &result{err: fmt.Errorf("start %s: %w", sysName, err)}
		}
		return
	}
	defer func() {
		if err := sys.close(); err != nil {
			slog.Warn("stopping system", "system", sysName, "err", err)
		}
	}()

	prefilled := false
	var prefillErr error
	for _, sc := range scs {
		if ctx.Err() != nil {
			return
		}
		m := newCPUMeter(sys.serverPID())
		var r result
		switch sc.kind {
		case kindPush:
			r = sys.push(ctx, sc, m)
		case kindPopAck, kindFanOut:
			if !prefilled {
				prefilled = true
				t := time.Now()
				prefillErr = sys.prefill(ctx)
				slog.Info("pre-filled", "system", sysName, "messages", cfg.prefill, "took", time.Since(t).Round(time.Millisecond), "err", prefillErr)
			}
			if prefillErr != nil {
				r = result{err: fmt.Errorf("pre-fill: %w", prefillErr)}
				break
			}
			if sc.kind == kindPopAck {
				r = sys.popAck(ctx, sc, m)
			} else {
				r = sys.fanOut(ctx, sc, m)
			}
		case kindLatency:
			r = sys.latency(ctx, m)
		case kindMemory:
			r = sys.memory(ctx, sc, m)
		}
		m.fill(&r)
		results[sc.name][sysName] = &r
		if r.err != nil {
			slog.Error("scenario failed", "system", sysName, "scenario", sc.name, "err", r.err)
			continue
		}
		slog.Info("done", "system", sysName, "scenario", sc.name, "msgs/s", fmtRate(r.rate()),
			"p50", fmtDur(r.p(50)), "p99", fmtDur(r.p(99)), "msgs", r.msgs, "samples", len(r.lat),
			"cpu_client", fmtCores(r.clientCores), "cpu_server", fmtCores(r.serverCores), "note", r.note)
	}
}
