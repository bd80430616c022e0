package cluster

import (
	"math/rand"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkOwnAppendToSynced times the leader's own appends under
// FsyncAlways from the append's return to the syncer recording its index
// as synced (what a parked durable reply waits for, replies.go), on the OS's
// file system. One writer appends one entry at a time with random gaps of
// mean gap (QUEEN_SYNCWAIT_GAP_US, default 150 µs), so that appends arrive
// while a round's fsync runs; it reports the wait's p50 and p99 and the
// fsyncs per append.
func BenchmarkOwnAppendToSynced(b *testing.B) {
	gap := 150 * time.Microsecond
	if v, err := strconv.Atoi(os.Getenv("QUEEN_SYNCWAIT_GAP_US")); err == nil && v > 0 {
		gap = time.Duration(v) * time.Microsecond
	}
	// QUEEN_SYNCWAIT_WRITER=1: the writer runs the round itself when the
	// syncer is idle (Node's writers do); else a worker is asked for it.
	writer := os.Getenv("QUEEN_SYNCWAIT_WRITER") == "1"
	const entries = 3000
	for i := 0; i < b.N; i++ {
		s := newLogSyncer(FsyncAlways, 10*time.Second, quietLogger())
		type mark struct {
			at     time.Time
			synced uint64
		}
		var (
			mu    sync.Mutex
			marks []mark
		)
		s.onSynced = func() {
			m := mark{at: time.Now(), synced: s.Synced()}
			mu.Lock()
			marks = append(marks, m)
			mu.Unlock()
		}
		wal, err := s.openWAL(b.TempDir(), 0)
		if err != nil {
			b.Fatal(err)
		}
		log := &syncedLog{WAL: wal, s: s}
		s.writerSyncs = writer
		rng := rand.New(rand.NewSource(int64(i)))
		appended := make([]time.Time, entries+1)
		rounds0 := s.rounds.Load()
		pause := func(d time.Duration) {
			for t := time.Now(); time.Since(t) < d; {
				time.Sleep(d - time.Since(t))
			}
		}
		// A turn of the writer appends until it hands on (as the append
		// thread does, syncturn.go) to run a round on an idle syncer.
		done := make(chan error, 1)
		var turn func(from uint64)
		turn = func(from uint64) {
			for e := from; e <= entries; e++ {
				if err := log.storeLogs([]*walRecord{durableEntry(e)}, true); err != nil {
					done <- err
					return
				}
				appended[e] = time.Now()
				d := time.Duration(rng.ExpFloat64() * float64(gap))
				if writer && s.uncovered() {
					if s.takeIdle() {
						go func() { pause(d); turn(e + 1) }()
						s.roundTaken()
						return
					}
					s.demand()
				}
				pause(d)
			}
			done <- nil
		}
		turn(1)
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for s.Synced() < entries && time.Now().Before(deadline) {
			s.demand()
			time.Sleep(time.Millisecond)
		}
		rounds := s.rounds.Load() - rounds0
		s.close()
		wal.Close()
		mu.Lock()
		var waits []time.Duration
		k := 0
		for e := uint64(1); e <= entries; e++ {
			for k < len(marks) && marks[k].synced < e {
				k++
			}
			if k == len(marks) {
				b.Fatalf("entry %d never recorded synced", e)
			}
			waits = append(waits, marks[k].at.Sub(appended[e]))
		}
		mu.Unlock()
		slices.Sort(waits)
		b.ReportMetric(float64(waits[len(waits)/2].Microseconds()), "wait-p50-µs")
		b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "wait-p99-µs")
		b.ReportMetric(float64(rounds)/entries, "fsyncs/append")
	}
}
