package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
)

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// faultsNow is the number of minor page faults this process took so far:
// first touches of pages the kernel maps (about 11 µs each on the machine
// these benchmarks were written on; docs/benchmarks.md, "Session 22").
func faultsNow() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Minflt
}

// BenchmarkThroughput measures the broker's Go API under concurrency (no
// HTTP): 4 producers pushing batches of 100, and 4 consumers popping 100
// and acking. It reports msgs/s and the process CPU time per message, which
// is steadier than wall time on a shared machine.
// Run: go test ./internal/broker -run '^$' -bench Throughput -benchtime 1x
func BenchmarkThroughput(b *testing.B) {
	// Negative: over -parts partitions, each item with its own client
	// transaction id (a dedup lookup per item).
	for _, parts := range []int{1, 100, -100} {
		txids := parts < 0
		if txids {
			parts = -parts
		}
		name := fmt.Sprintf("push/partitions=%d", parts)
		if txids {
			name += "/transactionIds"
		}
		b.Run(name, func(b *testing.B) {
			br := openBroker(b)
			ctx := context.Background()
			var n atomic.Int64
			cpu0, start := cpuNow(), time.Now()
			var wg sync.WaitGroup
			for w := 0; w < 4; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Since(start) < 3*time.Second; i++ {
						items := make([]PushItem, 100)
						for j := range items {
							items[j] = PushItem{Queue: "t", Partition: fmt.Sprintf("p%d", (i+j)%parts), Payload: []byte(`{"x":"abcdefghijklmnopqrstuvwx"}`)}
							if txids {
								// What a Queen client sends: a UUIDv7 per item.
								id, err := uuid.NewV7()
								if err != nil {
									b.Error(err)
									return
								}
								items[j].TxID = id.String()
							}
						}
						if _, err := br.Push(ctx, "default", items); err != nil {
							b.Error(err)
							return
						}
						n.Add(100)
					}
				}()
			}
			wg.Wait()
			el, cpu := time.Since(start), cpuNow()-cpu0
			b.ReportMetric(float64(n.Load())/el.Seconds(), "msgs/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(n.Load()), "cpu-ns/msg")
		})
	}
	b.Run("pop+ack", func(b *testing.B) {
		br := openBroker(b)
		ctx := context.Background()
		for i := 0; i < 1000; i++ {
			items := make([]PushItem, 100)
			for j := range items {
				items[j] = PushItem{Queue: "c", Partition: fmt.Sprintf("p%d", j), Payload: []byte(`{"x":"abcdefghijklmnopqrstuvwx"}`)}
			}
			if _, err := br.Push(ctx, "default", items); err != nil {
				b.Fatal(err)
			}
		}
		var n atomic.Int64
		cpu0, start := cpuNow(), time.Now()
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "c", Group: "g", SubscriptionMode: "all", Batch: 100, Partitions: 10})
					if err != nil || len(r.Messages) == 0 {
						return
					}
					acks := make([]AckItem, len(r.Messages))
					for j, m := range r.Messages {
						acks[j] = AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: "g", LeaseID: r.LeaseID}
					}
					if _, err := br.Ack(ctx, "default", acks); err != nil {
						b.Error(err)
						return
					}
					n.Add(int64(len(r.Messages)))
				}
			}()
		}
		wg.Wait()
		el, cpu := time.Since(start), cpuNow()-cpu0
		if n.Load() != 100000 {
			b.Fatalf("consumed %d of 100000", n.Load())
		}
		b.ReportMetric(float64(n.Load())/el.Seconds(), "msgs/s")
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(n.Load()), "cpu-ns/msg")
	})
}
