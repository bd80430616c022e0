package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

var systemTitles = map[string]string{
	sysJS:            "JetStream (defaults: fsync every 2 min)",
	sysJSSync:        "JetStream (sync_interval: always)",
	sysQueen:         "queen (QUEEN_FSYNC=always: every reply after its fsync)",
	sysQueenInterval: "queen (QUEEN_FSYNC=interval: the log fsynced every 100 ms, replies before)",
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// loadAvg returns the 1-minute load average and the share of the last 10 s in
// which some task waited for CPU or for I/O (Linux PSI): how busy the shared
// machine was.
func loadAvg() string {
	out := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			out = f[0]
		}
	}
	for _, res := range []string{"cpu", "io"} {
		b, err := os.ReadFile("/proc/pressure/" + res)
		if err != nil {
			continue
		}
		line, _, _ := strings.Cut(string(b), "\n")
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "avg10="); ok {
				out += fmt.Sprintf(", %s waiting %s%%", res, v)
			}
		}
	}
	return out
}

func natsClientVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/nats-io/nats.go" {
				return d.Version
			}
		}
	}
	return "unknown"
}

// table is a list of rows printed either aligned (tabwriter) or as markdown.
type table struct {
	head []string
	rows [][]string
}

func (t *table) print(w io.Writer, markdown bool) {
	if markdown {
		fmt.Fprintf(w, "| %s |\n", strings.Join(t.head, " | "))
		seps := make([]string, len(t.head))
		for i := range seps {
			if i == 0 {
				seps[i] = "---"
			} else {
				seps[i] = "---:"
			}
		}
		fmt.Fprintf(w, "|%s|\n", strings.Join(seps, "|"))
		for _, r := range t.rows {
			fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
		}
		return
	}
	// Left-align the first column by padding it; the numbers align right.
	w0 := len([]rune(t.head[0]))
	for _, r := range t.rows {
		w0 = max(w0, len([]rune(r[0])))
	}
	pad := func(s string) string { return s + strings.Repeat(" ", w0-len([]rune(s))) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, pad(t.head[0])+"\t"+strings.Join(t.head[1:], "\t")+"\t")
	for _, r := range t.rows {
		fmt.Fprintln(tw, pad(r[0])+"\t"+strings.Join(r[1:], "\t")+"\t")
	}
	tw.Flush()
}

func printReport(w io.Writer, cfg *config, scs []scenario, results map[string]map[string]*result, info map[string]string, took time.Duration) {
	h := func(format string, a ...any) {
		if cfg.markdown {
			fmt.Fprintf(w, "- "+format+"\n", a...)
		} else {
			fmt.Fprintf(w, "  "+format+"\n", a...)
		}
	}
	if cfg.markdown {
		fmt.Fprintln(w, "## queen vs NATS JetStream")
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "queen vs NATS JetStream")
	}
	h("date: %s, run took %s", time.Now().UTC().Format(time.RFC3339), took.Round(time.Second))
	h("machine: %s/%s, NumCPU=%d, GOMAXPROCS=%d, %s, cpu %q", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), cpuModel())
	where := "in-process"
	if natsInChild {
		where = "in a child process"
	}
	qc := "Go net/http"
	if cfg.queenClient == "raw" {
		qc = "lean HTTP/1.1 (-queen-client raw)"
	}
	h("nats-server %s (%s), nats.go %s; queen %s, its client %s", server.VERSION, where, natsClientVersion(), orDash(info["queen"]), qc)
	h("closed-loop clients (c=): %s; push: %s measured after %s warm-up; pre-fill %d msgs over %d partitions; latency %d msg/s for %s, its consumer's acks %s",
		joinInts(cfg.clients), cfg.pushDur, cfg.warmup, cfg.prefill, cfg.consPartitions, cfg.latRate, cfg.latDur, latencyAckTitle[cfg.latAck])
	for _, sys := range cfg.systems {
		h("%s = %s", sys, systemTitles[sys])
	}
	h("load (1-min load average, PSI some avg10) at start: %s; at end: %s", info["load-start"], loadAvg())
	h("fsync of 4 KiB on the data disk: %s (the floor under a durable write's latency)", info["fsync"])
	h("NOTE: one noisy shared 2-core machine; server and bench client share the cores. Absolute numbers drift between runs, the ratios are what matter.")
	fmt.Fprintln(w)

	var systems []string
	systems = append(systems, cfg.systems...)
	var queens, baselines []string
	for _, s := range systems {
		if isQueen(s) {
			queens = append(queens, s)
		} else {
			baselines = append(baselines, s)
		}
	}
	hasQueen := len(queens) > 0

	t := &table{head: []string{"scenario"}}
	for _, s := range systems {
		t.head = append(t.head, s+" msgs/s", s+" p50", s+" p99")
	}
	for _, q := range queens {
		for _, b := range baselines {
			t.head = append(t.head, q+"/"+b)
		}
	}
	type failure struct {
		scn, sys, msg string
		more          int
	}
	var failures []*failure
	seenErr := map[string]*failure{}
	for _, sc := range scs {
		row := []string{sc.name}
		for _, s := range systems {
			r := results[sc.name][s]
			switch {
			case r == nil:
				row = append(row, "-", "-", "-")
			case r.err != nil:
				row = append(row, "ERROR", "-", "-")
				msg := r.err.Error()
				if prev, ok := seenErr[s+"\x00"+msg]; ok {
					prev.more++
					break
				}
				f := &failure{scn: sc.name, sys: s, msg: msg}
				seenErr[s+"\x00"+msg] = f
				failures = append(failures, f)
			default:
				if len(r.lat) == 0 {
					row = append(row, fmtRate(r.rate()), "-", "-")
				} else {
					row = append(row, fmtRate(r.rate()), fmtDur(r.p(50)), fmtDur(r.p(99)))
				}
				if r.note != "" {
					failures = append(failures, &failure{scn: sc.name, sys: s, msg: "note: " + r.note})
				}
			}
		}
		for _, qs := range queens {
			q := results[sc.name][qs]
			for _, b := range baselines {
				row = append(row, ratioCell(sc, q, results[sc.name][b]))
			}
		}
		t.rows = append(t.rows, row)
	}
	t.print(w, cfg.markdown)
	fmt.Fprintln(w)
	legend := func(line string) {
		if cfg.markdown {
			line = "- " + line
		}
		fmt.Fprintln(w, line)
	}
	if hasQueen {
		legend("ratio: that queen's msgs/s ÷ JetStream's msgs/s (above 1: queen moves more); on the latency row: queen p99 ÷ JetStream p99 (below 1: queen is faster).")
	}
	legend("push: msgs/s counts messages acknowledged in the window; p50/p99 = one batch, send to ack of the whole batch.")
	legend("pop+ack, fan-out: msgs/s = messages delivered and acknowledged ÷ time to drain; p50/p99 = one pop (Fetch) plus its ack round trip.")
	legend("latency: p50/p99 = receive time − send time embedded in the payload (includes the producer's commit).")
	fmt.Fprintln(w)

	ct := &table{head: []string{"scenario"}}
	split := func(s string) bool { return isQueen(s) || natsInChild }
	for _, s := range systems {
		if split(s) {
			ct.head = append(ct.head, s+" client", s+" server")
		} else {
			ct.head = append(ct.head, s+" client+server")
		}
	}
	for _, sc := range scs {
		row := []string{sc.name}
		for _, s := range systems {
			r := results[sc.name][s]
			if r == nil || r.err != nil {
				row = append(row, "-")
				if split(s) {
					row = append(row, "-")
				}
				continue
			}
			row = append(row, fmtCores(r.clientCores))
			if split(s) {
				row = append(row, fmtCores(r.serverCores))
			}
		}
		ct.rows = append(ct.rows, row)
	}
	if cfg.markdown {
		fmt.Fprintln(w, "### CPU cores busy during the measured window")
		fmt.Fprintln(w)
	} else {
		if natsInChild {
			fmt.Fprintln(w, "CPU cores busy during the measured window:")
		} else {
			fmt.Fprintln(w, "CPU cores busy during the measured window (JetStream runs inside the bench process, so its column is client+server):")
		}
	}
	ct.print(w, cfg.markdown)
	fmt.Fprintln(w)

	var details []string
	for _, sc := range scs {
		for _, s := range systems {
			if r := results[sc.name][s]; r != nil && r.err == nil && r.detail != "" {
				details = append(details, fmt.Sprintf("%s / %s: %s", sc.name, s, r.detail))
			}
		}
	}
	if len(details) > 0 {
		if cfg.markdown {
			fmt.Fprintln(w, "### Details")
			fmt.Fprintln(w)
		} else {
			fmt.Fprintln(w, "Details:")
		}
		for _, d := range details {
			fmt.Fprintln(w, "  - "+d)
		}
		fmt.Fprintln(w)
	}
	if len(failures) > 0 {
		if cfg.markdown {
			fmt.Fprintln(w, "### Errors and notes")
			fmt.Fprintln(w)
		} else {
			fmt.Fprintln(w, "Errors and notes:")
		}
		for _, f := range failures {
			scn := f.scn
			if f.more > 0 {
				scn += fmt.Sprintf(" (and %d more scenarios)", f.more)
			}
			line := fmt.Sprintf("%s, %s: %s", f.sys, scn, f.msg)
			fmt.Fprintln(w, "  - "+strings.ReplaceAll(line, "\n", "\n    "))
		}
	}
}

func ratioCell(sc scenario, q, b *result) string {
	if q == nil || b == nil || q.err != nil || b.err != nil {
		return "-"
	}
	if sc.kind == kindLatency {
		bp, qp := b.p(99), q.p(99)
		if bp <= 0 {
			return "-"
		}
		return fmt.Sprintf("p99 %.2f×", float64(qp)/float64(bp))
	}
	if b.rate() <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", q.rate()/b.rate())
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

var latencyAckTitle = map[string]string{
	latencyAckExplicit: "explicit (queen: leasing pops, each batch acknowledged after receipt; JetStream: AckExplicit)",
	latencyAckNone:     "none (queen: autoAck=true; JetStream: AckNone)",
}
