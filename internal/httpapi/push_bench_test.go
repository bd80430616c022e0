package httpapi

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
)

// BenchmarkPushHTTP: 4 clients push one 30 B message each per request
// through the server's handlers (ServeHTTP; net/http's connection handling
// is not in it) on a single node under each fsync policy, as the
// bench's "push b=1 30B 1p c=4" row does over HTTP. It reports the
// process's CPU per push (steadier than the wall time on a shared machine)
// beside the allocations.
func BenchmarkPushHTTP(b *testing.B) {
	for _, mode := range []cluster.FsyncMode{cluster.FsyncInterval, cluster.FsyncAlways} {
		b.Run(string(mode), func(b *testing.B) { benchPushHTTP(b, mode) })
	}
}

func benchPushHTTP(b *testing.B, mode cluster.FsyncMode) {
	br, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: b.TempDir(), RaftAddr: authzFreeAddr(b), Fsync: mode}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { br.Close() })
	for start := time.Now(); !br.Health().Leader; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			b.Fatal("no leader")
		}
	}
	s := New(br, Config{})
	body := []byte(`{"items":[{"queue":"bench","partition":"p0","payload":{"n":"012345678901234567"}}]}`)
	const clients = 4
	var next atomic.Int64
	var failed atomic.Value
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := benchCPU()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			w := &nullWriter{h: http.Header{}}
			for next.Add(1) <= int64(b.N) {
				w.reset()
				r := httptest.NewRequest(http.MethodPost, "/api/v1/push", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				s.ServeHTTP(w, r)
				if w.code != http.StatusCreated {
					failed.Store(w.body.String())
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if v := failed.Load(); v != nil {
		b.Fatalf("push answered %v", v)
	}
	b.ReportMetric(float64(benchCPU()-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
}

// benchCPU is the process's user and system CPU time so far.
func benchCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
