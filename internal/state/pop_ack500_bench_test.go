package state

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/queen-mq/queen/internal/testkit"
)

// BenchmarkStatePopAck500 is the PostgreSQL sink's loop on the state
// machine alone (entries encoded and decoded as the log carries them, no
// raft, no HTTP): pop up to 500 messages of about 200 bytes from 16
// partitions, acknowledge them all by offset, as the sink does, and again.
// QUEEN_BENCH_CPUPROFILE=file profiles the measured loop only (not the
// pushes that fill the queue). Run with -benchtime Nx.
func BenchmarkStatePopAck500(b *testing.B) {
	h := newHarness(b)
	payload := []byte(`{"id":123456,"customer":"c-00042","amount":"19.99","status":"new","region":"eu-west","note":"a note of some length to make the message about two hundred bytes long ....."}`)
	// The queue is filled 100,000 messages at a time (about 30 MB, less
	// than a memtable, as a sink that keeps up reads what was just
	// pushed), with the clock stopped; in a CPU profile these pushes carry
	// the label phase=fill (-tagignore phase=fill).
	const round = 100_000
	var cpu time.Duration // of the measured loop, the fills left out
	fill := func() {
		b.StopTimer()
		cpu += cpuTime()
		pprof.Do(context.Background(), pprof.Labels("phase", "fill"), func(context.Context) {
			for i := 0; i < round; i += 500 {
				p := &Push{Tenant: "default"}
				for j := 0; j < 500; j++ {
					p.Items = append(p.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", j%16), TxID: uuid.NewString(), Generated: true, Payload: payload})
				}
				h.apply(p)
			}
		})
		cpu -= cpuTime()
		b.StartTimer()
	}
	stop := benchProfile(b)
	defer stop()
	b.ResetTimer()
	cpu -= cpuTime()
	n, left := 0, 0
	for i := 0; i < b.N; i++ {
		if left < 500 {
			fill()
			left += round
		}
		got := popAckAll(b, h, 500, 16, n)
		n += got
		left -= got
	}
	b.StopTimer()
	cpu += cpuTime()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/msg")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/msg")
}

// benchProfile starts a CPU profile into QUEEN_BENCH_CPUPROFILE when it is
// set, and returns what stops it.
func benchProfile(b *testing.B) func() {
	return testkit.CPUProfile(b, os.Getenv("QUEEN_BENCH_CPUPROFILE"))
}

// popAckAll pops up to batch messages from up to parts partitions of queue
// q for group g and acknowledges them all by offset, as the sink does; n
// (the messages so far) only names the failure. It returns how many it
// took.
func popAckAll(b *testing.B, h *harness, batch, parts, n int) int {
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: batch, Partitions: parts, LeaseSeconds: 300})
	if len(r.Messages) == 0 {
		b.Fatalf("nothing to pop after %d messages", n)
	}
	items := make([]AckItem, 0, len(r.Messages))
	offs := make([]uint64, len(r.Messages))
	runs := os.Getenv("QUEEN_BENCH_ACK_RUNS") != "" // a partition's consecutive offsets as one item, as the sink acks since session 21
	for j, m := range r.Messages {
		if n := len(items); runs && n > 0 && items[n-1].PartitionID == m.PartitionID && *items[n-1].Offset+max(items[n-1].Count, 1) == m.Offset {
			items[n-1].Count = max(items[n-1].Count, 1) + 1
			continue
		}
		offs[j] = m.Offset
		items = append(items, AckItem{PartitionID: m.PartitionID, Offset: &offs[j], TxIDKnown: true, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
	}
	if res := h.ack(items...); !res.Items[len(items)-1].Success {
		b.Fatalf("ack: %+v", res.Items[len(items)-1])
	}
	return len(r.Messages)
}
