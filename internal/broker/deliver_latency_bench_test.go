package broker

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/queen-mq/queen/internal/cluster"
)

// BenchmarkDeliverLatency measures push→consumer latency through the
// broker's Go API on one node, as the bench's latency row does over HTTP:
// one producer pushes one message every millisecond (open loop) while one
// consumer long-polls with autoAck. It reports the p50 and p99 of the time
// from a push's start to its delivery, under each fsync policy, beside the
// p50 and p99 of a 4 KiB write and fsync in the same data directory,
// measured in the same run just before, and the log entries per message
// (the push's, and the consumer's pops, found empty or not), and the pops
// the consumer's long polls proposed that found nothing, per message.
// Run: go test ./internal/broker -run '^$' -bench DeliverLatency -benchtime 1x
func BenchmarkDeliverLatency(b *testing.B) {
	for _, mode := range []cluster.FsyncMode{cluster.FsyncAlways, cluster.FsyncInterval} {
		b.Run(string(mode), func(b *testing.B) {
			dir := b.TempDir()
			f50, f99 := fsyncQuantiles(b, dir, 500)
			br, err := Open(Config{Cluster: cluster.Config{DataDir: filepath.Join(dir, "n"), RaftAddr: freeAddr(b), Fsync: mode}})
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			waitLeader(b, br)
			idx0 := br.Node().CommitIndex()
			sub0 := submits(b, br)
			lat, slow, pushes, polls := deliverLatencies(b, br, "lat", 3*time.Second, time.Millisecond)
			b.ReportMetric(float64(br.Node().CommitIndex()-idx0)/float64(len(lat)), "entries/msg")
			// Every submit is a push or a pop (or a rare tick); a poll
			// that returned messages made one pop that found some.
			empty := submits(b, br) - sub0 - uint64(pushes) - uint64(polls)
			b.ReportMetric(float64(empty)/float64(len(lat)), "empty-pops/msg")
			b.Logf("%d messages, %d delivering polls, %d empty pops", len(lat), polls, empty)
			p50, p99 := quantile(lat, 0.5), quantile(lat, 0.99)
			b.Logf("the 10 slowest deliveries (sent at, since the start; latency): %s", slow)
			b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
			b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
			b.ReportMetric(float64(f50.Microseconds()), "fsync-p50-µs")
			b.ReportMetric(float64(f99.Microseconds()), "fsync-p99-µs")
		})
	}
}

func waitLeader(t testing.TB, br *Broker) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !br.Node().IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// submits is how many commands the broker has submitted.
func submits(t testing.TB, br *Broker) uint64 {
	var m dto.Metric
	if err := br.m.applyLat.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// deliverLatencies pushes one message every gap for d (after a warm-up of
// d/10) while one consumer long-polls queue with autoAck, and returns the
// push-start-to-delivery time of every message sent after the warm-up,
// the 10 slowest with their send times, how many pushes it made and how
// many of the consumer's polls returned messages.
func deliverLatencies(t testing.TB, br *Broker, queue string, d, gap time.Duration) ([]time.Duration, string, int, int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := br.Push(ctx, "default", []PushItem{{Queue: queue, Partition: "p0", Payload: []byte(`0`)}}); err != nil {
		t.Fatal(err)
	}
	warm := d / 10
	total := int((warm + d) / gap)
	var (
		mu    sync.Mutex
		lat   []time.Duration
		at    []time.Duration // send time since t0, by lat's index
		seen  int
		polls int
		done  = make(chan struct{})
	)
	t0 := time.Now()
	go func() {
		for ctx.Err() == nil {
			r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: queue, Batch: 100, AutoAck: true, Wait: true, Timeout: 30 * time.Second})
			if err != nil {
				if ctx.Err() == nil {
					t.Error(err)
				}
				return
			}
			now := time.Now()
			mu.Lock()
			if len(r.Messages) > 0 {
				polls++
			}
			for _, m := range r.Messages {
				ns, err := strconv.ParseInt(string(m.Data), 10, 64)
				if err != nil || ns == 0 {
					continue // the first message, or not ours
				}
				if sent := time.Unix(0, ns); sent.Sub(t0) >= warm {
					lat = append(lat, now.Sub(sent))
					at = append(at, sent.Sub(t0))
				}
				if seen++; seen == total {
					close(done)
				}
			}
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	for k := range total {
		time.Sleep(time.Until(t0.Add(time.Duration(k) * gap)))
		wg.Go(func() {
			st := time.Now()
			if _, err := br.Push(ctx, "default", []PushItem{{Queue: queue, Partition: "p0", Payload: strconv.AppendInt(nil, st.UnixNano(), 10)}}); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d of %d messages delivered after 30 s", seen, total)
	}
	mu.Lock()
	defer mu.Unlock()
	idx := make([]int, len(lat))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return int(lat[b] - lat[a]) })
	var slow strings.Builder
	for _, i := range idx[:min(10, len(idx))] {
		fmt.Fprintf(&slow, "%v: %v; ", at[i].Round(time.Millisecond), lat[i].Round(10*time.Microsecond))
	}
	return slices.Clone(lat), slow.String(), total + 1, polls
}

// fsyncQuantiles writes and fsyncs 4 KiB n times in a file in dir and
// returns the p50 and p99 of the fsync: appends, as the bench's probe
// does, so each fsync also writes the file's new size.
func fsyncQuantiles(t testing.TB, dir string, n int) (time.Duration, time.Duration) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fsync-probe"))
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	d := make([]time.Duration, 0, n)
	for i := range n {
		binary.LittleEndian.PutUint64(buf, uint64(i))
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
		st := time.Now()
		if err := f.Sync(); err != nil {
			t.Fatal(fmt.Errorf("fsync probe: %w", err))
		}
		d = append(d, time.Since(st))
	}
	return quantile(d, 0.5), quantile(d, 0.99)
}

func quantile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}
