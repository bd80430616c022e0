package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/queen-mq/queen/internal/state"
)

// benchNode opens a single-node cluster under mode, leading, closed when
// the benchmark ends.
func benchNode(b *testing.B, mode FsyncMode) *Node {
	cfg := Config{DataDir: filepath.Join(b.TempDir(), "n1"), NodeID: "n1", RaftAddr: freeAddr(b),
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger(),
		Fsync: mode}
	cfg.Peers = []Peer{{ID: "n1", Address: cfg.RaftAddr}}
	n, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	tc := &testCluster{t: b, cfgs: []Config{cfg}, nodes: []*Node{n}}
	tc.leader()
	return n
}

// BenchmarkSubmitOneNode: 4 submitters of a one-message push on a single
// node, under each fsync policy. It reports the process's CPU per push
// (steadier than the wall time on a shared machine) beside ns/op.
func BenchmarkSubmitOneNode(b *testing.B) {
	for _, mode := range []FsyncMode{FsyncInterval, FsyncAlways} {
		b.Run(string(mode), func(b *testing.B) {
			n := benchNode(b, mode)
			ctx := context.Background()
			var seq atomic.Int64
			const submitters = 4
			var wg sync.WaitGroup
			var next atomic.Int64
			b.ResetTimer()
			cpu0 := processCPU()
			idx0 := n.CommitIndex()
			for range submitters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						id := fmt.Sprintf("m%d", seq.Add(1))
						if _, err := n.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "bench", Partition: "p", TxID: id, Payload: []byte(`{"x":1}`)}}}, 64); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
			b.ReportMetric(float64(b.N)/float64(n.CommitIndex()-idx0), "pushes/entry")
		})
	}
}

// BenchmarkPopAckOneNode: 4 consumers of one group drain 100,000 messages
// (100 partitions) per op on a single node, each popping 100 (leasing) and
// acking them, under each fsync policy. It reports msgs/s and the pop's
// and the ack's median (no HTTP: Node.Submit).
func BenchmarkPopAckOneNode(b *testing.B) {
	for _, mode := range []FsyncMode{FsyncInterval, FsyncAlways} {
		b.Run(string(mode), func(b *testing.B) {
			n := benchNode(b, mode)
			ctx := context.Background()
			var (
				mu         sync.Mutex
				pops, acks []time.Duration
				msgs       int
				elapsed    time.Duration
			)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for p := 0; p < 100; p++ {
					for k := 0; k < 10; k++ {
						if _, err := n.Submit(ctx, pushN("q", fmt.Sprintf("p%d", p), i*1000+k*100, i*1000+k*100+100), 4096); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StartTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							t0 := time.Now()
							v, err := n.Submit(ctx, &state.Pop{Tenant: "default", Queue: "q", Group: "g", Batch: 100, Partitions: 10, LeaseSeconds: 60, LeaseID: uuid.NewString(), SubMode: "all"}, 64)
							if err != nil {
								b.Error(err)
								return
							}
							popped := time.Since(t0)
							r := v.(*state.PopResult)
							if len(r.Messages) == 0 {
								return
							}
							a := &state.Ack{Tenant: "default"}
							for _, m := range r.Messages {
								a.Items = append(a.Items, state.AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: state.AckCompleted, Group: "g", LeaseID: r.LeaseID})
							}
							t1 := time.Now()
							if _, err := n.Submit(ctx, a, 4096); err != nil {
								b.Error(err)
								return
							}
							acked := time.Since(t1)
							mu.Lock()
							pops, acks = append(pops, popped), append(acks, acked)
							msgs += len(r.Messages)
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				elapsed += time.Since(start)
			}
			b.StopTimer()
			median := func(d []time.Duration) float64 {
				if len(d) == 0 {
					return 0
				}
				slices.Sort(d)
				return float64(d[len(d)/2].Microseconds())
			}
			b.ReportMetric(float64(msgs)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(median(pops), "pop-p50-µs")
			b.ReportMetric(median(acks), "ack-p50-µs")
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
