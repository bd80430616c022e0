package stages

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/queen-mq/queen/internal/stagetime"
)

// sample is one stage of one request: its wall time and, when both ends
// were stamped on the same thread, its CPU time.
type sample struct {
	wall, cpu time.Duration
	cpuOK     bool
}

// stage derives one stage's sample from a request's trace and entry.
type stage struct {
	name string
	// cpu: the stage runs on one thread, so its CPU time is measured.
	cpu bool
	get func(t *stagetime.Trace, e *stagetime.EntryView, q quorum) (sample, bool)
}

// quorum is when an entry was on disk on enough nodes to commit, and the
// fastest follower's write.
type quorum struct {
	ready    stagetime.Stamp // leader written, and the fastest follower too (3 nodes)
	follower *stagetime.Write
}

func quorumOf(e *stagetime.EntryView, nodes int) quorum {
	q := quorum{ready: e.At[stagetime.StoreEnd]}
	if nodes == 1 {
		return q
	}
	// Three voters commit with the leader and one follower: the fastest.
	for i := range e.Followers {
		f := &e.Followers[i]
		if q.follower == nil || f.End.Wall < q.follower.End.Wall {
			q.follower = f
		}
	}
	if q.follower != nil && q.follower.End.Wall > q.ready.Wall {
		q.ready = q.follower.End
	}
	return q
}

// inverted counts spans whose end was stamped before their start: a
// stage whose bounds are not ordered (a bug in the hooks); reported.
var inverted int

func span(a, b stagetime.Stamp) (sample, bool) {
	if !a.Set() || !b.Set() {
		return sample{}, false
	}
	if b.Wall < a.Wall {
		inverted++
		return sample{}, false
	}
	w, c, ok := stagetime.Span(a, b)
	return sample{wall: w, cpu: c, cpuOK: ok}, true
}

func reqSpan(from, to stagetime.Mark) func(*stagetime.Trace, *stagetime.EntryView, quorum) (sample, bool) {
	return func(t *stagetime.Trace, _ *stagetime.EntryView, _ quorum) (sample, bool) {
		return span(t.At[from], t.At[to])
	}
}

func entrySpan(from, to stagetime.EntryMark) func(*stagetime.Trace, *stagetime.EntryView, quorum) (sample, bool) {
	return func(_ *stagetime.Trace, e *stagetime.EntryView, _ quorum) (sample, bool) {
		return span(e.At[from], e.At[to])
	}
}

var stages = []stage{
	{"HTTP body read + decode", true, reqSpan(stagetime.Start, stagetime.Decoded)},
	{"validation, command built (broker)", true, reqSpan(stagetime.Decoded, stagetime.Validated)},
	{"broker → proposal queue", true, reqSpan(stagetime.Validated, stagetime.Queued)},
	{"wait for the ready loop to propose it (group commit)", false, reqSpan(stagetime.Queued, stagetime.Proposed)},
	{"entry encode", true, func(t *stagetime.Trace, e *stagetime.EntryView, _ quorum) (sample, bool) {
		s, ok := span(t.At[stagetime.Proposed], e.At[stagetime.Handed])
		if c, ok2 := span(e.At[stagetime.Encode], e.At[stagetime.Handed]); ok2 {
			s.cpu, s.cpuOK = c.cpu, c.cpuOK
		}
		return s, ok
	}},
	{"Propose and the ready loop, before the log write", false, entrySpan(stagetime.Handed, stagetime.StoreStart)},
	{"raft-wal append + fsync (leader)", true, entrySpan(stagetime.StoreStart, stagetime.StoreEnd)},
	{"replication: until a follower has it on disk", false, func(_ *stagetime.Trace, e *stagetime.EntryView, q quorum) (sample, bool) {
		if q.follower == nil {
			return sample{}, false
		}
		return span(e.At[stagetime.StoreEnd], q.ready)
	}},
	{"  of which the follower's append + fsync", true, func(_ *stagetime.Trace, _ *stagetime.EntryView, q quorum) (sample, bool) {
		if q.follower == nil {
			return sample{}, false
		}
		return span(q.follower.Start, q.follower.End)
	}},
	{"commit notice + hand-over to the state machine", false, func(_ *stagetime.Trace, e *stagetime.EntryView, q quorum) (sample, bool) {
		return span(q.ready, e.At[stagetime.ApplyStart])
	}},
	{"state machine apply (Pebble batch)", true, entrySpan(stagetime.ApplyStart, stagetime.ApplyEnd)},
	{"result back to the handler", false, func(t *stagetime.Trace, e *stagetime.EntryView, _ quorum) (sample, bool) {
		return span(e.At[stagetime.ApplyEnd], t.At[stagetime.Result])
	}},
	{"reply encode + write", true, reqSpan(stagetime.Result, stagetime.Written)},
	{"handler total", false, reqSpan(stagetime.Start, stagetime.Written)},
}

// complete reports whether a trace went through one leader entry with
// every stamp set (the first requests after Enable may miss some; Woken
// is only a long poll's).
func complete(t *stagetime.Trace, e *stagetime.EntryView) bool {
	for m := stagetime.Start; m < stagetime.NumMarks; m++ {
		if m != stagetime.Woken && !t.At[m].Set() {
			return false
		}
	}
	for m := stagetime.Encode; m < stagetime.NumEntryMarks; m++ {
		if !e.At[m].Set() {
			return false
		}
	}
	return true
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t / time.Duration(len(ds))
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/1e3) }

// caseReport is one case's traces and what the clients saw.
type caseReport struct {
	scenario string
	nodes    int
	clients  int
	load     loadResult
	cores    float64 // process CPU (server and clients) per wall second
	loadAvg  string
	traces   []*stagetime.Trace
	stores   []stagetime.Interval
	applies  []stagetime.Interval
}

// kinds lists the request kinds a scenario's traces hold.
func (c *caseReport) kinds() []string {
	if c.scenario == "push" {
		return []string{"push"}
	}
	return []string{"pop", "ack"}
}

// write prints the case's stage table per request kind.
func (c *caseReport) write(w io.Writer) {
	fmt.Fprintf(w, "\n#### %s, %d node(s), %d client(s)\n\n", c.scenario, c.nodes, c.clients)
	rate := float64(c.load.msgs) / c.load.elapsed.Seconds()
	fmt.Fprintf(w, "%.0f msgs/s; the process (server and clients) kept %.2f cores busy; load average %s.\n", rate, c.cores, c.loadAvg)
	for _, kind := range c.kinds() {
		var ts []*stagetime.Trace
		var es []stagetime.EntryView
		untimed := 0
		for _, t := range c.traces {
			if t.Kind != kind {
				continue
			}
			if t.Entry == nil {
				untimed++
				continue
			}
			e := t.Entry.View()
			if !complete(t, &e) {
				untimed++
				continue
			}
			ts = append(ts, t)
			es = append(es, e)
		}
		cl := c.load.latency[kind]
		fmt.Fprintf(w, "\n%s: %d requests timed; client round trip p50 %s µs, p99 %s µs, mean %s µs.\n\n", kind, len(ts), us(pct(cl, .5)), us(pct(cl, .99)), us(mean(cl)))
		if untimed > 0 {
			// A request forwarded after a leader change is not timed past
			// this node, nor one whose entry started before timing did.
			fmt.Fprintf(w, "%d %s requests were not timed through a leader entry (a leader change sends them to another node).\n\n", untimed, kind)
		}
		if len(ts) == 0 {
			continue
		}
		fmt.Fprintln(w, "| stage | wall p50 | wall p99 | CPU p50 | CPU p99 | wait p50 | wait p99 | share of handler time |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
		var totalMean time.Duration
		{
			var tot []time.Duration
			for i := range ts {
				s, _ := reqSpan(stagetime.Start, stagetime.Written)(ts[i], &es[i], quorum{})
				tot = append(tot, s.wall)
			}
			totalMean = mean(tot)
		}
		for _, st := range stages {
			var wall, cpu, wait []time.Duration
			for i := range ts {
				s, ok := st.get(ts[i], &es[i], quorumOf(&es[i], c.nodes))
				if !ok {
					continue
				}
				wall = append(wall, s.wall)
				if st.cpu && s.cpuOK {
					cpu = append(cpu, s.cpu)
					wait = append(wait, max(s.wall-s.cpu, 0))
				}
			}
			if len(wall) == 0 {
				continue
			}
			cp50, cp99, wp50, wp99 := "–", "–", "all", "all"
			if st.cpu {
				cp50, cp99, wp50, wp99 = us(pct(cpu, .5)), us(pct(cpu, .99)), us(pct(wait, .5)), us(pct(wait, .99))
			}
			share := float64(mean(wall)) / float64(totalMean) * 100
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %.0f%% |\n", st.name, us(pct(wall, .5)), us(pct(wall, .99)), cp50, cp99, wp50, wp99, share)
		}
		c.writeWaits(w, es)
	}
}

// writeWaits prints, for the entries of one request kind, how long a
// committed entry waited behind a log write of other entries and behind
// the state machine's apply of an earlier batch, between its commit and
// the start of its own apply.
func (c *caseReport) writeWaits(w io.Writer, es []stagetime.EntryView) {
	seen := map[uint64]bool{}
	var behindWrite, behindApply, window, before, beforeWrite []time.Duration
	hit := 0
	for i := range es {
		e := &es[i]
		if seen[e.Index] {
			continue
		}
		seen[e.Index] = true
		q := quorumOf(e, c.nodes)
		from, to := q.ready.Wall, e.At[stagetime.ApplyStart].Wall
		if to < from {
			continue
		}
		own := stagetime.Interval{Start: e.At[stagetime.StoreStart].Wall, End: e.At[stagetime.StoreEnd].Wall}
		h := e.At[stagetime.Handed].Wall
		before = append(before, time.Duration(own.Start-h))
		beforeWrite = append(beforeWrite, overlap(c.stores, h, own.Start, own))
		bw := overlap(c.stores, from, to, own)
		ba := overlap(c.applies, from, to, stagetime.Interval{})
		if bw > 0 {
			hit++
		}
		behindWrite = append(behindWrite, bw)
		behindApply = append(behindApply, ba)
		window = append(window, time.Duration(to-from))
	}
	if len(window) == 0 {
		return
	}
	fmt.Fprintf(w, "\nBetween commit and apply (%d entries): %.0f%% of the entries waited behind another log write (the leader loop was writing); that wait p50 %s µs, p99 %s µs, mean %s µs of a mean %s µs from commit to apply; behind the state machine's previous batch mean %s µs.\n",
		len(window), float64(hit)/float64(len(window))*100, us(pct(behindWrite, .5)), us(pct(behindWrite, .99)), us(mean(behindWrite)), us(mean(window)), us(mean(behindApply)))
	fmt.Fprintf(w, "Before its own log write an entry waited a mean %s µs (p99 %s), of which %s µs behind the log write of earlier entries.\n",
		us(mean(before)), us(pct(before, .99)), us(mean(beforeWrite)))
}

// overlap is how much of [from, to] the intervals cover, leaving out skip.
func overlap(iv []stagetime.Interval, from, to int64, skip stagetime.Interval) time.Duration {
	i := sort.Search(len(iv), func(i int) bool { return iv[i].End > from })
	var sum int64
	for ; i < len(iv) && iv[i].Start < to; i++ {
		if iv[i] == skip {
			continue
		}
		sum += min(iv[i].End, to) - max(iv[i].Start, from)
	}
	return time.Duration(max(sum, 0))
}

// claims prints the figures docs/design/performance.md quotes.
func claims(w io.Writer, cases []*caseReport) {
	if inverted > 0 {
		fmt.Fprintf(w, "\nWARNING: %d stage spans ended before they started and were left out.\n", inverted)
	}
	fmt.Fprint(w, "\n#### The pop's own log write\n\n")
	fmt.Fprintln(w, "| nodes | clients | pop round trip, mean | its own log write (+ replication), mean | share | Propose to committed, mean | share |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range cases {
		if c.scenario != "pop+ack" {
			continue
		}
		var own, path []time.Duration
		for _, t := range c.traces {
			if t.Kind != "pop" || t.Entry == nil {
				continue
			}
			e := t.Entry.View()
			if !complete(t, &e) {
				continue
			}
			q := quorumOf(&e, c.nodes)
			own = append(own, time.Duration(q.ready.Wall-e.At[stagetime.StoreStart].Wall))
			path = append(path, time.Duration(q.ready.Wall-e.At[stagetime.Handed].Wall))
		}
		rt := mean(c.load.latency["pop"])
		if rt == 0 || len(own) == 0 {
			continue
		}
		fmt.Fprintf(w, "| %d | %d | %s µs | %s µs | %.0f%% | %s µs | %.0f%% |\n", c.nodes, c.clients, us(rt), us(mean(own)), float64(mean(own))/float64(rt)*100,
			us(mean(path)), float64(mean(path))/float64(rt)*100)
	}
}
