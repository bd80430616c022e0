package state

import (
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's CPU time so far, steadier than wall time on a
// shared machine (it includes Pebble's flushes and compactions).
// flushAndReport ends a benchmark's measured part once everything applied
// is committed and flushed, so Pebble's work on it is inside the figure:
// it reports the process's CPU per message since cpu0 and returns the
// store's write statistics.
func flushAndReport(b *testing.B, s *Store, cpu0 time.Duration, n int) WriteStats {
	b.Helper()
	s.waitCommitted()
	if err := s.db.Flush(); err != nil {
		b.Fatal(err)
	}
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/msg")
	return s.WriteStats()
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPushBatch applies pushes of 1,000 messages, each with a client
// transaction id, either into 1,000 partitions that do not exist yet (what
// a database snapshot does: one partition per row key) or over 16 existing
// partitions. It reports the apply time and the process CPU time per
// message.
// Run: go test ./internal/state -run '^$' -bench BenchmarkPushBatch -count 5
func BenchmarkPushBatch(b *testing.B) {
	const batch = 1000
	for _, mode := range []string{"new", "existing16"} {
		b.Run("partitions="+mode, func(b *testing.B) {
			h := newHarness(b)
			h.push("q", "p0", `0`)
			n := 0
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				c := &Push{Tenant: "default", Items: make([]PushItem, batch)}
				for j := range c.Items {
					part := fmt.Sprintf("p%d", j%16)
					if mode == "new" {
						part = fmt.Sprintf("row-%09d", n)
					}
					c.Items[j] = PushItem{Queue: "q", Partition: part, TxID: fmt.Sprintf("0190a8c4-%04x-7000-8000-%012x", n>>32&0xffff, n), Payload: []byte(`{"id":1,"name":"abcdefghijklmnop"}`)}
					n++
				}
				h.index++
				data, err := EncodeEntry(&Entry{Time: h.now, Cmds: []Command{c}})
				if err != nil {
					b.Fatal(err)
				}
				res, err := h.s.ApplyBatch([]LogEntry{{Index: h.index, Data: data}})
				if err != nil {
					b.Fatal(err)
				}
				if r := res[0][0].(*PushResult); r.Err != nil || len(r.Items) != batch || r.Items[batch-1].Duplicate {
					b.Fatalf("push: %+v", r.Err)
				}
				h.now += 1000
			}
			b.StopTimer()
			h.s.waitCommitted()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/msg")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/msg")
		})
	}
}

// BenchmarkSnapshotRows applies what a database snapshot's bundles are to
// the state machine: commands of 1,000 messages of a source's event size
// (about 270 bytes), each into a new partition with a transaction id, and
// flushes the memtables at the end, so the figures cover all of Pebble's
// work on the rows. It reports the process CPU per message and the bytes
// per message of the batches, of the flushed tables and blob files, and of
// compactions.
// Run: go test ./internal/state -run '^$' -bench BenchmarkSnapshotRows -benchtime 600x
func BenchmarkSnapshotRows(b *testing.B) {
	payload := []byte(`{"op":"c","table":"public.b","key":{"id":1},"after":{"id":1,"name":"c4ca4238a0b923820dcc509a6f75849bc4ca4238a0b923820dcc509a6f75849bc4ca4238a0b923820dcc509a6f75849b","n":1},"before":null,"lsn":"0/1","xid":1,"ts":"2026-10-03T06:15:03.000000Z","seq":0}`)
	const batch = 1000
	h := newHarness(b)
	s := h.s
	h.push("b", "p0", `0`)
	n := 0
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		c := &Push{Tenant: "default", Items: make([]PushItem, batch)}
		for j := range c.Items {
			c.Items[j] = PushItem{Queue: "b", Partition: strconv.Itoa(n), TxID: fmt.Sprintf("pg:00000001:%016X:%d", i, j), Payload: payload}
			n++
		}
		h.index++
		data, err := EncodeEntry(&Entry{Time: h.now, Cmds: []Command{c}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := h.s.ApplyBatch([]LogEntry{{Index: h.index, Data: data}}); err != nil {
			b.Fatal(err)
		}
		h.now += 1000
	}
	w := flushAndReport(b, s, cpu0, n)
	b.ReportMetric(float64(w.BatchBytes)/float64(n), "batchB/msg")
	b.ReportMetric(float64(w.FlushedTableBytes)/float64(n), "flushTB/msg")
	b.ReportMetric(float64(w.FlushedBlobBytes)/float64(n), "flushBB/msg")
	b.ReportMetric(float64(w.CompactedTableBytes+w.CompactedBlobBytes)/float64(n), "compB/msg")
	b.ReportMetric(float64(w.Flushes), "flushes")
	b.ReportMetric(float64(w.Compactions), "compactions")
}

// BenchmarkApplyOnePush applies one-message pushes, one entry per batch, as
// a node applies a single producer's b=1 pushes: the batch's fixed costs
// (its commit, the queue and meta records) carried by one message. It
// reports the process CPU per push and the batch bytes per push.
// Run: go test ./internal/state -run '^$' -bench BenchmarkApplyOnePush -benchtime 100000x
func BenchmarkApplyOnePush(b *testing.B) {
	h := newHarness(b)
	h.push("q", "p0", `0`)
	s := h.s
	w0 := s.WriteStats()
	payload := []byte(`{"i":123456789012345678901}`)
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		c := &Push{Tenant: "default", Items: []PushItem{{Queue: "q", Partition: "Default", TxID: fmt.Sprintf("0190a8c4-%04x-7000-8000-%012x", i>>32&0xffff, i), Payload: payload}}}
		h.index++
		data, err := EncodeEntry(&Entry{Time: h.now, Cmds: []Command{c}})
		if err != nil {
			b.Fatal(err)
		}
		res, err := s.ApplyBatch([]LogEntry{{Index: h.index, Data: data}})
		if err != nil {
			b.Fatal(err)
		}
		if r := res[0][0].(*PushResult); r.Err != nil || r.Items[0].Offset != uint64(i) {
			b.Fatalf("push %d: %+v", i, r)
		}
		h.now += 10
	}
	s.waitCommitted()
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/msg")
	b.ReportMetric(float64(s.WriteStats().BatchBytes-w0.BatchBytes)/float64(b.N), "batchB/msg")
}
