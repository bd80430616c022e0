package stages

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/stagetime"
)

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func envInts(name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			panic(fmt.Sprintf("%s=%q: want a comma-separated list of positive numbers", name, v))
		}
		out = append(out, n)
	}
	return out
}

// collector keeps the traces the hooks hand over.
type collector struct {
	mu     sync.Mutex
	traces []*stagetime.Trace
}

func (c *collector) add(t *stagetime.Trace) {
	c.mu.Lock()
	c.traces = append(c.traces, t)
	c.mu.Unlock()
}

// measure runs one case with stage timing on; warm is run first, untimed.
func measure(b *testing.B, s *server, scenario string, nodes, clients int, d time.Duration, run func(time.Duration) (loadResult, error)) *caseReport {
	b.Helper()
	col := &collector{}
	la := loadAvg()
	stagetime.Enable(col.add)
	cpu0 := processCPU()
	res, err := run(d)
	cpu := processCPU() - cpu0
	stagetime.Disable()
	if err != nil {
		b.Fatalf("%s, %d nodes, %d clients: %v", scenario, nodes, clients, err)
	}
	if res.msgs == 0 {
		b.Fatalf("%s, %d nodes, %d clients: no messages moved", scenario, nodes, clients)
	}
	stores, applies := stagetime.Intervals()
	col.mu.Lock()
	defer col.mu.Unlock()
	return &caseReport{scenario: scenario, nodes: nodes, clients: clients, load: res,
		cores: cpu.Seconds() / res.elapsed.Seconds(), loadAvg: la, traces: col.traces, stores: stores, applies: applies}
}

// BenchmarkStages prints the stage tables of docs/benchmarks.md ("Where a
// push and a pop spend their time"): a push of 100 small messages to one
// partition, and a pop of 100 with its ack, under 1, 4 and 16 closed-loop
// clients, on one node and on three.
func BenchmarkStages(b *testing.B) {
	secs := envInts("QUEEN_STAGES_SECONDS", []int{4})[0]
	d := time.Duration(secs) * time.Second
	var cases []*caseReport
	for _, nodes := range envInts("QUEEN_STAGES_NODES", []int{1, 3}) {
		for _, clients := range envInts("QUEEN_STAGES_CLIENTS", []int{1, 4, 16}) {
			s := startServer(b, nodes)
			// Warm up the connections and the queue's records, untimed.
			if _, err := runPush(s, "push", clients, 300*time.Millisecond); err != nil {
				b.Fatal(err)
			}
			cases = append(cases, measure(b, s, "push", nodes, clients, d, func(d time.Duration) (loadResult, error) {
				return runPush(s, "push", clients, d)
			}))
			// Enough messages for the window at a generous rate.
			need := int(d.Seconds() * 60000 / float64(nodes))
			if err := fill(s, "popq", need); err != nil {
				b.Fatal(err)
			}
			cases = append(cases, measure(b, s, "pop+ack", nodes, clients, d, func(d time.Duration) (loadResult, error) {
				return runPopAck(s, "popq", clients, d)
			}))
		}
	}
	w := os.Stdout
	fmt.Fprintf(w, "\n### Stage tables (%s, %d s per case, QUEEN_FSYNC=%s, µs)\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), secs, fsyncMode(b))
	if os.Getenv("QUEEN_STAGES_OVERHEAD") != "" {
		overhead(b, w, d)
	}
	for _, c := range cases {
		c.write(w)
	}
	claims(w, cases)
}

// overhead pushes with timing off and on, alternately, on one node with
// 4 clients, and prints the rates: the cost of the measurement itself.
func overhead(b *testing.B, w io.Writer, d time.Duration) {
	s := startServer(b, 1)
	if _, err := runPush(s, "push", 4, 300*time.Millisecond); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(w, "\nTiming's own cost, push b=100 to one partition, 1 node, 4 clients, alternating (load average %s):", loadAvg())
	for i := range 4 {
		timed := i%2 == 1
		if timed {
			stagetime.Enable(func(*stagetime.Trace) {})
		}
		r, err := runPush(s, "push", 4, d)
		stagetime.Disable()
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(w, " %s %.0f msgs/s;", map[bool]string{false: "off", true: "on"}[timed], float64(r.msgs)/r.elapsed.Seconds())
	}
	fmt.Fprintln(w)
}

// TestStagesRecorded: with timing on, a push, a pop and an ack through
// HTTP each come back with every stage stamped, in order, through one log
// entry that the leader wrote and then applied; with timing off the hooks
// record nothing.
func TestStagesRecorded(t *testing.T) {
	s := startServer(t, 1)
	col := &collector{}
	stagetime.Enable(col.add)
	if _, _, err := s.do(context.Background(), http.MethodPost, "/api/v1/push", pushBody("rec", 3, 1, 0), http.StatusCreated); err != nil {
		t.Fatal(err)
	}
	body, _, err := s.do(context.Background(), http.MethodGet, "/api/v1/pop/queue/rec?batch=10&consumerGroup=g&subscriptionMode=all", nil, http.StatusOK)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runAck(s, body); err != nil {
		t.Fatal(err)
	}
	stagetime.Disable()
	col.mu.Lock()
	got := append([]*stagetime.Trace(nil), col.traces...)
	col.mu.Unlock()
	var kinds []string
	for _, tr := range got {
		kinds = append(kinds, tr.Kind)
		if tr.Entry == nil {
			t.Fatalf("%s: no log entry recorded", tr.Kind)
		}
		e := tr.Entry.View()
		if !complete(tr, &e) {
			t.Fatalf("%s: stamps missing: request %+v, entry %+v", tr.Kind, tr.At, e.At)
		}
		order := []int64{tr.At[stagetime.Start].Wall, tr.At[stagetime.Decoded].Wall, tr.At[stagetime.Validated].Wall, tr.At[stagetime.Queued].Wall,
			tr.At[stagetime.Proposed].Wall, e.At[stagetime.Encode].Wall, e.At[stagetime.Handed].Wall, e.At[stagetime.StoreStart].Wall,
			e.At[stagetime.StoreEnd].Wall, e.At[stagetime.ApplyStart].Wall, e.At[stagetime.ApplyEnd].Wall, e.At[stagetime.Returned].Wall,
			tr.At[stagetime.Result].Wall, tr.At[stagetime.Written].Wall}
		for i := 1; i < len(order); i++ {
			if order[i] < order[i-1] {
				t.Fatalf("%s: stamp %d (%d) before stamp %d (%d)", tr.Kind, i, order[i], i-1, order[i-1])
			}
		}
		if e.Index == 0 || e.Cmds < 1 || e.Batch < 1 {
			t.Fatalf("%s: entry index %d, %d commands, apply batch of %d", tr.Kind, e.Index, e.Cmds, e.Batch)
		}
		if w, _, _ := stagetime.Span(e.At[stagetime.StoreStart], e.At[stagetime.StoreEnd]); w <= 0 {
			t.Fatalf("%s: log write took %v", tr.Kind, w)
		}
	}
	if strings.Join(kinds, ",") != "push,pop,ack" {
		t.Fatalf("traces %v, want push,pop,ack", kinds)
	}
	stores, applies := stagetime.Intervals()
	if len(stores) < 3 || len(applies) < 3 {
		t.Fatalf("%d log writes and %d applies recorded, want at least 3 each", len(stores), len(applies))
	}
	// Off: nothing more is recorded.
	if _, _, err := s.do(context.Background(), http.MethodPost, "/api/v1/push", pushBody("rec", 1, 1, 0), http.StatusCreated); err != nil {
		t.Fatal(err)
	}
	col.mu.Lock()
	n := len(col.traces)
	col.mu.Unlock()
	if n != 3 {
		t.Fatalf("%d traces after timing was switched off, want 3", n)
	}
	if tr := stagetime.Begin("push"); tr != nil {
		t.Fatal("Begin returned a trace with timing off")
	}
}
