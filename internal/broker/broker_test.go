package broker

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/testkit"

	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/state"
)

func openBroker(t testing.TB) *Broker {
	t.Helper()
	b, err := Open(Config{Cluster: cluster.Config{DataDir: t.TempDir(), RaftAddr: freeAddr(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !b.Node().IsLeader() {
		if ctx.Err() != nil {
			t.Fatal("no leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b
}

// TestLongPollWokenByPush: a waiting pop returns as soon as a push commits,
// not at its timeout.
func TestLongPollWokenByPush(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	if _, err := b.Push(ctx, "default", []PushItem{{Queue: "lp", Partition: "p", Payload: []byte(`0`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "lp", AutoAck: true}); err != nil {
		t.Fatal(err)
	}
	done := make(chan *PopResponse, 1)
	start := time.Now()
	go func() {
		r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "lp", AutoAck: true, Wait: true, Timeout: 20 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := b.Push(ctx, "default", []PushItem{{Queue: "lp", Partition: "p", Payload: []byte(`1`)}}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if len(r.Messages) != 1 || string(r.Messages[0].Data) != "1" {
		t.Fatalf("long poll got %+v", r)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Fatalf("long poll returned only at its timeout (%v): the push did not wake it", el)
	}
}

// TestInputValidation: the Go API refuses what the HTTP API refuses.
func TestInputValidation(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	long := string(make([]byte, 129))
	cases := []struct {
		name  string
		err   error
		field string
	}{
		{"empty queue", pushErr(b, ctx, PushItem{Queue: "", Partition: "p", Payload: []byte(`1`)}), "items[0].queue"},
		{"long queue", pushErr(b, ctx, PushItem{Queue: long, Partition: "p", Payload: []byte(`1`)}), "items[0].queue"},
		{"bad char", pushErr(b, ctx, PushItem{Queue: "a/b", Partition: "p", Payload: []byte(`1`)}), "items[0].queue"},
		{"long partition", pushErr(b, ctx, PushItem{Queue: "q", Partition: long, Payload: []byte(`1`)}), "items[0].partition"},
		{"batch", popErr(b, ctx, PopRequest{Queue: "q", Batch: 10001}), "batch"},
		{"lease", popErr(b, ctx, PopRequest{Queue: "q", LeaseSeconds: 4}), "leaseSeconds"},
		{"mode", popErr(b, ctx, PopRequest{Queue: "q", Group: "g", SubscriptionMode: "sometimes"}), "subscriptionMode"},
	}
	for _, c := range cases {
		e, ok := c.err.(*Error)
		if !ok || e.Code != "invalid_parameter" || e.Field != c.field {
			t.Errorf("%s: got %v, want invalid_parameter on %s", c.name, c.err, c.field)
		}
	}
}

func pushErr(b *Broker, ctx context.Context, it PushItem) error {
	_, err := b.Push(ctx, "default", []PushItem{it})
	return err
}

func popErr(b *Broker, ctx context.Context, r PopRequest) error {
	r.Tenant = "default"
	_, err := b.Pop(ctx, r)
	return err
}

// BenchmarkPartitionScale compares the per-message cost of push and of
// pop+ack over a queue with 100 partitions and one with 1,000,000. Each
// queue has a broker of its own, open only while it is measured (so that
// neither pays for the other's heap or compactions), in the order 100,
// 1,000,000, 1,000,000, 100: a load that rises or falls through the run
// then weighs on both alike. It prints each one's cost and the large
// queue's rate as a share of the small one's.
// Run with `make bench-scale`.
func BenchmarkPartitionScale(b *testing.B) {
	large := 1_000_000
	if testing.Short() {
		large = 1000
	}
	order := []int{100, large, large, 100}
	ctx := context.Background()
	wall := map[string]map[int]time.Duration{"push100": {}, "pop100+ack": {}}
	msgs := map[string]map[int]int{"push100": {}, "pop100+ack": {}}
	for _, parts := range order {
		br := openBroker(b)
		// Prefill: one message in every partition.
		const chunk = 10000
		for i := 0; i < parts; i += chunk {
			items := make([]PushItem, 0, chunk)
			for j := i; j < min(i+chunk, parts); j++ {
				items = append(items, PushItem{Queue: "scale", Partition: fmt.Sprintf("p%07d", j), Payload: []byte(`{"k":1}`)})
			}
			if _, err := br.Push(ctx, "default", items); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("partitions=%d/push100", parts), func(b *testing.B) {
			defer scaleProfile(b, fmt.Sprintf("push-%d", parts))()
			w0 := br.Node().Store().WriteStats()
			cpu0, flt0 := cpuNow(), faultsNow()
			items := make([]PushItem, 100)
			for i := 0; i < b.N; i++ {
				for j := range items {
					items[j] = PushItem{Queue: "scale", Partition: fmt.Sprintf("p%07d", (i*100+j*7919)%parts), Payload: []byte(`{"k":2}`)}
				}
				if _, err := br.Push(ctx, "default", items); err != nil {
					b.Fatal(err)
				}
			}
			wall["push100"][parts] += b.Elapsed()
			msgs["push100"][parts] += b.N * 100
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/msg")
			b.ReportMetric(float64((cpuNow()-cpu0).Nanoseconds())/float64(b.N*100), "cpu-ns/msg")
			b.ReportMetric(float64(faultsNow()-flt0)/float64(b.N*100), "faults/msg")
			scaleWrites(b, w0, br.Node().Store().WriteStats(), b.N*100)
		})
		b.Run(fmt.Sprintf("partitions=%d/pop100+ack", parts), func(b *testing.B) {
			defer scaleProfile(b, fmt.Sprintf("pop-%d", parts))()
			w0 := br.Node().Store().WriteStats()
			cpu0, flt0 := cpuNow(), faultsNow()
			n := 0
			for i := 0; i < b.N; i++ {
				r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "scale", Group: "g", SubscriptionMode: "all", Batch: 100, Partitions: 100})
				if err != nil {
					b.Fatal(err)
				}
				if len(r.Messages) == 0 {
					b.Fatalf("nothing to pop after %d messages", n)
				}
				acks := make([]AckItem, len(r.Messages))
				for j, m := range r.Messages {
					acks[j] = AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: "g", LeaseID: r.LeaseID}
				}
				if _, err := br.Ack(ctx, "default", acks); err != nil {
					b.Fatal(err)
				}
				n += len(r.Messages)
			}
			wall["pop100+ack"][parts] += b.Elapsed()
			msgs["pop100+ack"][parts] += n
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/msg")
			b.ReportMetric(float64((cpuNow()-cpu0).Nanoseconds())/float64(n), "cpu-ns/msg")
			b.ReportMetric(float64(faultsNow()-flt0)/float64(n), "faults/msg")
			scaleWrites(b, w0, br.Node().Store().WriteStats(), n)
		})
		br.Close()
	}
	for _, op := range []string{"push100", "pop100+ack"} {
		if msgs[op][100] == 0 || msgs[op][large] == 0 {
			continue
		}
		small := float64(wall[op][100].Nanoseconds()) / float64(msgs[op][100])
		big := float64(wall[op][large].Nanoseconds()) / float64(msgs[op][large])
		fmt.Printf("%s: %.1f µs per message over 100 partitions, %.1f over %d: the large queue runs at %.2f× the small one's rate\n",
			op, small/1e3, big/1e3, large, small/big)
	}
}

// scaleWrites reports what the state store's Pebble wrote per message in a
// phase of BenchmarkPartitionScale: the bytes its compactions wrote, and
// the flushes and compactions run (a phase over a million partitions may
// also compact what its prefill wrote).
func scaleWrites(b *testing.B, w0, w1 state.WriteStats, n int) {
	b.ReportMetric(float64(w1.CompactedTableBytes+w1.CompactedBlobBytes-w0.CompactedTableBytes-w0.CompactedBlobBytes)/float64(n), "compact-B/msg")
	b.ReportMetric(float64(w1.Flushes-w0.Flushes), "flushes")
	b.ReportMetric(float64(w1.Compactions-w0.Compactions), "compactions")
}

// scaleProfile profiles one phase of BenchmarkPartitionScale into
// $QUEEN_BENCH_CPUPROFILE.<phase> (the last run of a phase wins) and
// returns the function that stops it; without the variable it does
// nothing.
func scaleProfile(b *testing.B, phase string) func() {
	path := os.Getenv("QUEEN_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	return testkit.CPUProfile(b, path+"."+phase)
}

func freeAddr(t testing.TB) string { return testkit.FreeAddr(t) }
