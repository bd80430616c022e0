package state

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
)

// BenchmarkStoreLongPush applies a fixed number of 1 KiB messages
// (QUEEN_BENCH_PUSH_MESSAGES, default 3,000,000) in pushes of 100 over 100
// partitions straight into a store, and prints for each sixth of them the
// process CPU per message and what compactions wrote: the store's share of
// a long push, by message count rather than by time, so that a busy machine
// changes how long it takes but not how much work each message costs.
// QUEEN_BENCH_PUSH_PARTITIONS sets the partitions; QUEEN_BENCH_LSM=1
// prints Pebble's levels at the end.
// Run: go test ./internal/state -run '^$' -bench BenchmarkStoreLongPush -benchtime 1x
func BenchmarkStoreLongPush(b *testing.B) {
	total := 3_000_000
	if v := os.Getenv("QUEEN_BENCH_PUSH_MESSAGES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 60_000 {
			b.Fatalf("QUEEN_BENCH_PUSH_MESSAGES=%q: want a whole number, at least 60000", v)
		}
		total = n
	}
	const size, batch, chunks = 1024, 100, 6
	parts := 100
	if v := os.Getenv("QUEEN_BENCH_PUSH_PARTITIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("QUEEN_BENCH_PUSH_PARTITIONS=%q: want a whole number, at least 1", v)
		}
		parts = n
	}
	seed := uint64(rand.Int64())
	b.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	payloads := make([][]byte, 4096)
	for i := range payloads {
		p := make([]byte, size)
		for j := range p {
			p[j] = 'a' + byte(r.IntN(26))
		}
		payloads[i] = p
	}
	h := newHarness(b)
	n := 0
	cpu0, st0 := cpuTime(), h.s.WriteStats()
	var cpus, comp, tables []string
	for k := 0; k < chunks; k++ {
		end := total * (k + 1) / chunks
		for n < end {
			c := &Push{Tenant: "default", Items: make([]PushItem, batch)}
			for j := range c.Items {
				c.Items[j] = PushItem{Queue: "q", Partition: "p" + strconv.Itoa((n+j)%parts), TxID: uuid.Must(uuid.NewV7()).String(), Generated: true, Payload: payloads[(n+j)%len(payloads)]}
			}
			n += batch
			h.index++
			data, err := EncodeEntry(&Entry{Time: h.now, Cmds: []Command{c}})
			if err != nil {
				b.Fatal(err)
			}
			res, err := h.s.ApplyBatch([]LogEntry{{Index: h.index, Data: data}})
			if err != nil {
				b.Fatal(err)
			}
			if r := res[0][0].(*PushResult); r.Err != nil {
				b.Fatalf("push: %v", r.Err)
			}
			h.now += 100
		}
		cpu, st := cpuTime(), h.s.WriteStats()
		m := float64(total / chunks)
		cpus = append(cpus, fmt.Sprintf("%.2f", float64((cpu-cpu0).Microseconds())/m))
		comp = append(comp, fmt.Sprintf("%.0f", float64(st.CompactedTableBytes-st0.CompactedTableBytes)/m))
		tables = append(tables, fmt.Sprintf("%d/%d", st.L0Files, st.L0Sublevels))
		cpu0, st0 = cpu, st
	}
	b.Logf("CPU µs per message per sixth: %v", cpus)
	b.Logf("compacted table bytes per message per sixth: %v", comp)
	b.Logf("L0 files/sublevels after each sixth: %v", tables)
	if os.Getenv("QUEEN_BENCH_LSM") != "" {
		fmt.Println(h.s.DB().Metrics()) // b.Logf would cut the table short
	}
}

// BenchmarkStorePopAfterLongPush pushes 1,200,000 messages of 1 KiB over
// 100 partitions, then pops half of them (batches of 100, autoAck) while
// level 0 still holds the push's flushed tables: what the read
// amplification that a long push leaves costs a consumer.
// Run: go test ./internal/state -run '^$' -bench BenchmarkStorePopAfterLongPush -benchtime 1x
func BenchmarkStorePopAfterLongPush(b *testing.B) {
	const total, batch, parts = 1_200_000, 100, 100
	payload := make([]byte, 1024)
	for i := range payload {
		payload[i] = 'a' + byte(i*7%26)
	}
	h := newHarness(b)
	for n := 0; n < total; n += batch {
		c := &Push{Tenant: "default", Items: make([]PushItem, batch)}
		for j := range c.Items {
			c.Items[j] = PushItem{Queue: "q", Partition: "p" + strconv.Itoa((n+j)%parts), TxID: uuid.Must(uuid.NewV7()).String(), Generated: true, Payload: payload}
		}
		h.push1(c)
		h.now += 100
	}
	h.s.waitCommitted()
	st := h.s.WriteStats()
	cpu0, t0 := cpuTime(), time.Now()
	got := 0
	for got < total/2 {
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: batch, Partitions: 1, AutoAck: true})
		if r.Err != nil || len(r.Messages) == 0 {
			b.Fatalf("pop after %d messages: %d messages, err %v", got, len(r.Messages), r.Err)
		}
		got += len(r.Messages)
	}
	cpu, wall := cpuTime()-cpu0, time.Since(t0)
	b.Logf("level 0 before the pops: %d tables in %d sublevels; %d popped: %.2f µs CPU and %.2f µs per message",
		st.L0Files, st.L0Sublevels, got, float64(cpu.Microseconds())/float64(got), float64(wall.Microseconds())/float64(got))
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(got), "cpu-ns/msg")
}

// push1 applies one push and fails on its error.
func (h *harness) push1(c *Push) {
	h.t.Helper()
	if r := h.apply(c)[0].(*PushResult); r.Err != nil {
		h.t.Fatalf("push: %v", r.Err)
	}
}
