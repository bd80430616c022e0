package broker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkLongPush pushes for a long while (QUEEN_BENCH_PUSH_SECONDS,
// default 60) with 4 producers sending batches of 100 over 100 partitions,
// and prints the rate in each 10 s window, the whole run's rate against the
// first window's (a push that slows down as the store fills shows below
// 1), and where the payload's bytes were written: the Raft log (the bytes
// this process wrote that Pebble did not), the memtable, and Pebble's
// flushes and compactions, each per payload byte.
// QUEEN_BENCH_LSM=1 prints Pebble's levels at the end.
// Run with `make bench-long-push`.
func BenchmarkLongPush(b *testing.B) {
	secs := 60
	if v := os.Getenv("QUEEN_BENCH_PUSH_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10 {
			b.Fatalf("QUEEN_BENCH_PUSH_SECONDS=%q: want a whole number of seconds, at least 10", v)
		}
		secs = n
	}
	const window = 10 * time.Second
	for _, size := range []int{1024, 30} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			br := openBroker(b)
			ctx := context.Background()
			payloads := randomPayloads(4096, size)
			dur := time.Duration(secs) * time.Second
			nWin := int(dur / window)
			counts := make([]atomic.Int64, nWin)
			wchar0 := procWchar(b)
			st0 := br.Node().Store().WriteStats()
			cpu0, start := cpuNow(), time.Now()
			// The process's CPU at each window's end: a window that costs
			// more CPU per message does more work, one that does not but
			// moves fewer messages waited (or the machine was busier).
			winCPU := make([]time.Duration, nWin)
			var wg sync.WaitGroup
			// QUEEN_BENCH_PROFILE_DIR=d writes a CPU profile of the first
			// and of the last window into d, to compare.
			profDir := os.Getenv("QUEEN_BENCH_PROFILE_DIR")
			profile := func(k int) {
				if profDir == "" || (k != 0 && k != nWin-1) {
					return
				}
				f, err := os.Create(filepath.Join(profDir, fmt.Sprintf("longpush-%d-window%d.prof", size, k)))
				if err != nil {
					b.Error(err)
					return
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					b.Log("no window profile:", err)
				}
			}
			wg.Go(func() {
				profile(0)
				for k := range winCPU {
					time.Sleep(time.Until(start.Add(time.Duration(k+1) * window)))
					winCPU[k] = cpuNow() - cpu0
					if profDir != "" && (k == 0 || k == nWin-1) {
						pprof.StopCPUProfile()
					}
					if k+1 < nWin {
						profile(k + 1)
					}
				}
			})
			for w := range 4 {
				wg.Go(func() {
					items := make([]PushItem, 100)
					for i := 0; ; i++ {
						for j := range items {
							items[j] = PushItem{Queue: "long", Partition: "p" + strconv.Itoa((i+j)%100), Payload: payloads[(i*len(items)+j+w*7)%len(payloads)]}
						}
						if _, err := br.Push(ctx, "default", items); err != nil {
							b.Error(err)
							return
						}
						k := int(time.Since(start) / window)
						if k >= nWin {
							return
						}
						counts[k].Add(int64(len(items)))
					}
				})
			}
			wg.Wait()
			cpu := cpuNow() - cpu0
			st := br.Node().Store().WriteStats()
			wchar := procWchar(b) - wchar0
			var total int64
			rates := make([]string, nWin)
			cpus := make([]string, nWin)
			for i := range counts {
				total += counts[i].Load()
				rates[i] = fmt.Sprintf("%.1fk", float64(counts[i].Load())/window.Seconds()/1e3)
				c := winCPU[i]
				if i > 0 {
					c -= winCPU[i-1]
				}
				cpus[i] = fmt.Sprintf("%.1f", float64(c.Microseconds())/float64(max(counts[i].Load(), 1)))
			}
			first := float64(counts[0].Load()) / window.Seconds()
			whole := float64(total) / (time.Duration(nWin) * window).Seconds()
			pay := float64(total) * float64(size)
			flushed := st.FlushedTableBytes + st.FlushedBlobBytes - st0.FlushedTableBytes - st0.FlushedBlobBytes
			compacted := st.CompactedTableBytes + st.CompactedBlobBytes - st0.CompactedTableBytes - st0.CompactedBlobBytes
			raftLog := float64(wchar) - float64(flushed+compacted)
			b.Logf("size %d B: msgs/s per %s: %s; whole %.1fk = %.2f× the first window", size, window, strings.Join(rates, " "), whole/1e3, whole/first)
			b.Logf("CPU µs per message per window: %s", strings.Join(cpus, " "))
			b.Logf("bytes per payload byte: raft log %.2f, memtable %.2f, flushed %.2f (tables %.2f, blob files %.2f), compacted %.2f (tables %.2f, blob files %.2f); all writes %.2f",
				raftLog/pay, float64(st.BatchBytes-st0.BatchBytes)/pay, float64(flushed)/pay,
				float64(st.FlushedTableBytes-st0.FlushedTableBytes)/pay, float64(st.FlushedBlobBytes-st0.FlushedBlobBytes)/pay,
				float64(compacted)/pay, float64(st.CompactedTableBytes-st0.CompactedTableBytes)/pay, float64(st.CompactedBlobBytes-st0.CompactedBlobBytes)/pay,
				float64(wchar)/pay)
			b.Logf("flushes %d, compactions %d, write stalls %d, L0 at the end: %d files in %d sublevels; CPU %.1f µs per message",
				st.Flushes-st0.Flushes, st.Compactions-st0.Compactions, st.WriteStalls-st0.WriteStalls, st.L0Files, st.L0Sublevels,
				float64(cpu.Microseconds())/float64(total))
			if os.Getenv("QUEEN_BENCH_LSM") != "" {
				fmt.Println(br.Node().Store().DB().Metrics()) // b.Logf would cut the table short
			}
			b.ReportMetric(whole, "msgs/s")
			b.ReportMetric(whole/first, "whole/first10s")
			b.ReportMetric(float64(wchar)/pay, "written/payload")
		})
	}
}

// randomPayloads are n JSON strings of size bytes in random letters, which
// compress about as much as a real message does (repeated letters or one
// payload for every message would compress away and hide what Pebble
// writes).
func randomPayloads(n, size int) [][]byte {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	seed := time.Now().UnixNano()
	fmt.Printf("randomPayloads: seed %d\n", seed)
	r := rand.New(rand.NewPCG(uint64(seed), 0))
	out := make([][]byte, n)
	for i := range out {
		b := make([]byte, 0, size)
		b = append(b, `{"x":"`...)
		for len(b) < size-2 {
			b = append(b, letters[r.IntN(len(letters))])
		}
		out[i] = append(b, `"}`...)
	}
	return out
}

// procWchar is the bytes this process has passed to write calls
// (/proc/self/io).
func procWchar(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Fatalf("read /proc/self/io: %v", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "wchar:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatalf("parse /proc/self/io wchar %q: %v", v, err)
			}
			return n
		}
	}
	b.Fatal("no wchar in /proc/self/io")
	return 0
}
