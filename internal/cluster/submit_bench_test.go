package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// BenchmarkSubmitOneNode: 4 submitters of a one-message push on a single
// node, under each fsync policy. It reports the process's CPU per push
// (steadier than the wall time on a shared machine) beside ns/op.
func BenchmarkSubmitOneNode(b *testing.B) {
	for _, mode := range []FsyncMode{FsyncInterval, FsyncAlways} {
		b.Run(string(mode), func(b *testing.B) {
			cfg := Config{DataDir: filepath.Join(b.TempDir(), "n1"), NodeID: "n1", RaftAddr: freeAddr(b),
				HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger(),
				Fsync: mode}
			cfg.Peers = []Peer{{ID: "n1", Address: cfg.RaftAddr}}
			n, err := Open(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			tc := &testCluster{t: b, cfgs: []Config{cfg}, nodes: []*Node{n}}
			tc.leader()
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

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
