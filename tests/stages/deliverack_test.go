package stages

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/queen-mq/queen/internal/stagetime"
)

// fsyncProbe times 200 writes of 4 KiB each followed by an fdatasync in
// the test's temporary directory, as the bench's probe does.
func fsyncProbe(b *testing.B) (p50, p99 time.Duration) {
	f, err := os.Create(filepath.Join(b.TempDir(), "probe"))
	if err != nil {
		b.Fatalf("fsync probe: %v", err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	var ds []time.Duration
	for range 200 {
		st := time.Now()
		if _, err := f.Write(buf); err != nil {
			b.Fatalf("fsync probe: %v", err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatalf("fsync probe: %v", err)
		}
		ds = append(ds, time.Since(st))
	}
	return pct(ds, 0.5), pct(ds, 0.99)
}

// spanTable prints p50, p99 and mean of each named span and how many
// deliveries (or requests) it was on.
func spanTable(w io.Writer, names []string, spans [][]time.Duration) {
	fmt.Fprintln(w, "| span | p50 | p99 | mean | on path |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for i, n := range names {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %d |\n", n, us(pct(spans[i], 0.5)), us(pct(spans[i], 0.99)), us(mean(spans[i])), len(spans[i]))
	}
}

// pushSpans prints where the pushes' own requests spent their time, from
// the handler's start to the reply written: under FsyncAlways "applied →
// result" is the wait of the durable reply for the leader's fsync.
func pushSpans(w io.Writer, pushes []*stagetime.Trace) {
	names := []string{"handler start → queued", "queued → proposed", "proposed → log write starts", "log write",
		"write → apply starts", "apply", "applied → handler has result (the fsync wait)", "result → reply written", "handler start → reply written"}
	spans := make([][]time.Duration, len(names))
	for _, t := range pushes {
		if t.Entry == nil {
			continue
		}
		e := t.Entry.View()
		pts := []int64{t.At[stagetime.Start].Wall, t.At[stagetime.Queued].Wall, t.At[stagetime.Proposed].Wall, e.At[stagetime.StoreStart].Wall,
			e.At[stagetime.StoreEnd].Wall, e.At[stagetime.ApplyStart].Wall, e.At[stagetime.ApplyEnd].Wall, t.At[stagetime.Result].Wall, t.At[stagetime.Written].Wall}
		if slices.Contains(pts, 0) {
			continue
		}
		for i := 1; i < len(pts); i++ {
			spans[i-1] = append(spans[i-1], time.Duration(pts[i]-pts[i-1]))
		}
		spans[len(names)-1] = append(spans[len(names)-1], time.Duration(pts[len(pts)-1]-pts[0]))
	}
	fmt.Fprintf(w, "\nthe pushes on the server (%d):\n\n", len(spans[0]))
	spanTable(w, names, spans)
}

// leaseWaits (QUEEN_STAGES_ACK=explicit) finds the deliveries whose
// message was sent while the partition was still leased to the previous
// batch: the server applied that batch's ack after the send, so the pop
// could take the message only once the ack released the lease. It prints
// how many, and their path through the previous batch's ack.
func leaseWaits(w io.Writer, rows []deliverRow, pops map[string]*stagetime.Trace, ackLog []ackSent, ackTraces []*stagetime.Trace) {
	sort.Slice(ackTraces, func(i, j int) bool {
		return ackTraces[i].At[stagetime.Start].Wall < ackTraces[j].At[stagetime.Start].Wall
	})
	sort.Slice(ackLog, func(i, j int) bool { return ackLog[i].sent.Before(ackLog[j].sent) })
	// Each ack the client sent, matched with the server's trace of it: the
	// k-th ack sent with the k-th to arrive (exact when acks go one at a
	// time), when it arrived between the ack's send and its reply.
	byBatch := map[int]*stagetime.Trace{}
	var ackRT, ackWait, ackFsync []time.Duration
	unmatched := 0
	for k, a := range ackLog {
		ackRT = append(ackRT, a.replied.Sub(a.sent))
		ackWait = append(ackWait, a.sent.Sub(a.recv))
		lo, hi := stagetime.Wall(a.sent), stagetime.Wall(a.replied)
		if len(ackTraces) != len(ackLog) || ackTraces[k].Entry == nil || ackTraces[k].At[stagetime.Start].Wall < lo || ackTraces[k].At[stagetime.Start].Wall > hi {
			unmatched++
			continue
		}
		t := ackTraces[k]
		byBatch[a.batch] = t
		if e := t.Entry.View(); e.At[stagetime.ApplyEnd].Set() && t.At[stagetime.Result].Set() {
			ackFsync = append(ackFsync, time.Duration(t.At[stagetime.Result].Wall-e.At[stagetime.ApplyEnd].Wall))
		}
	}
	ackAt := map[int]ackSent{}
	for _, a := range ackLog {
		ackAt[a.batch] = a
	}
	fmt.Fprintf(w, "\nthe consumer's acks (%d, %d not matched with the server's trace): batch received → ack sent (behind the acks before it) p50 %s, p99 %s; ack sent → answered p50 %s, p99 %s; on the server, applied → result (its fsync wait) p50 %s, p99 %s\n",
		len(ackLog), unmatched, us(pct(ackWait, 0.5)), us(pct(ackWait, 0.99)), us(pct(ackRT, 0.5)), us(pct(ackRT, 0.99)), us(pct(ackFsync, 0.5)), us(pct(ackFsync, 0.99)))
	names := []string{
		"send → previous batch received (its reply was on the way)",
		"→ its ack sent (behind the acks before it)",
		"→ ack request arrives",
		"→ ack's entry written",
		"→ ack applied (the lease released)",
		"→ pop woken",
		"→ pop's entry applied",
		"→ client has it",
	}
	spans := make([][]time.Duration, len(names))
	var held, total, queuedAtSend []time.Duration
	var other []time.Duration
	for _, r := range rows {
		prev, ok := byBatch[r.dv.batch-1]
		a, ok2 := ackAt[r.dv.batch-1]
		pt := pops[r.dv.pop]
		if !ok || !ok2 || pt == nil || pt.Entry == nil {
			continue
		}
		pe, ae := pt.Entry.View(), prev.Entry.View()
		sent := stagetime.Wall(r.dv.sent)
		total = append(total, r.total)
		if ae.At[stagetime.ApplyEnd].Wall <= sent {
			other = append(other, r.total)
			continue
		}
		held = append(held, r.total)
		if a.sent.After(r.dv.sent) && a.recv.Before(r.dv.sent) {
			queuedAtSend = append(queuedAtSend, r.total)
		}
		pts := []int64{stagetime.Wall(a.recv), stagetime.Wall(a.sent), prev.At[stagetime.Start].Wall, ae.At[stagetime.StoreEnd].Wall,
			ae.At[stagetime.ApplyEnd].Wall, pt.At[stagetime.Woken].Wall, pe.At[stagetime.ApplyEnd].Wall, stagetime.Wall(r.dv.recv)}
		last := sent
		for i, p := range pts {
			if p == 0 || p < last {
				continue
			}
			spans[i] = append(spans[i], time.Duration(p-last))
			last = p
		}
	}
	fmt.Fprintf(w, "\ndeliveries whose message was sent while the partition was still leased to the previous batch (its ack applied after the send): %d of %d (end to end p50 %s, p99 %s; the others p50 %s, p99 %s); of them, %d sent while that ack still waited on the client for the acks before it\n\n",
		len(held), len(total), us(pct(held, 0.5)), us(pct(held, 0.99)), us(pct(other, 0.5)), us(pct(other, 0.99)), len(queuedAtSend))
	spanTable(w, names, spans)
}
