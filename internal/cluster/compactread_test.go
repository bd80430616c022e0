package cluster

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/queen-mq/queen/internal/state"
)

// While the apply thread compacts the log, raft's reads of entries from
// the log file (a leader catching a follower up) get the entries or
// etcdraft.ErrCompacted, nothing else: raft panics on any other error of
// its Storage (raft's log.go, slice). The reader starts at the log's first
// index, right where each compaction cuts.
func TestLogReadsDuringCompactionSeeCompacted(t *testing.T) {
	const entries, span = 400, 32
	dir := t.TempDir()
	s := newLogSyncer(FsyncInterval, time.Hour, quietLogger())
	wal, err := s.openWAL(dir, 16<<10) // small segments: compaction also drops whole files
	if err != nil {
		t.Fatal(err)
	}
	defer wal.Close()
	defer s.close()
	ls, _, err := openLogStore(wal, &guardedLog{syncedLog: &syncedLog{WAL: wal, s: s}}, nil, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	var ents []*pb.Entry
	for i := uint64(1); i <= entries; i++ {
		ents = append(ents, &pb.Entry{Index: new(i), Term: new(uint64(1)), Type: pb.EntryNormal.Enum(), Data: make([]byte, 512)})
	}
	if err := ls.append(ents, false); err != nil {
		t.Fatal(err)
	}
	// Applied and no follower to keep them for: reads go to the log file.
	ls.releaseReplicated(math.MaxUint64)
	ls.releaseApplied(entries)
	if _, _, n := ls.recentRange(); n != 0 {
		t.Fatalf("%d entries still in memory; want none, so reads go to raft-wal", n)
	}

	var (
		stop          atomic.Bool
		reads, bad    atomic.Int64
		compactedSeen atomic.Int64
		firstBad      atomic.Value
		wg            sync.WaitGroup
	)
	// Two readers, as raft reads for two followers in turn.
	read := func() {
		defer wg.Done()
		for !stop.Load() {
			lo, _ := ls.FirstIndex()
			if lo+span > entries {
				return
			}
			got, err := ls.Entries(lo, lo+span, math.MaxUint64)
			reads.Add(1)
			switch {
			case err == etcdraft.ErrCompacted: // raft compares it so, unwrapped
				compactedSeen.Add(1)
			case err != nil:
				bad.Add(1)
				firstBad.CompareAndSwap(nil, err.Error())
			case len(got) != span || got[0].GetIndex() != lo:
				bad.Add(1)
				firstBad.CompareAndSwap(nil, "a short or misplaced read")
			}
		}
	}
	for range 2 {
		wg.Add(1)
		go read()
	}
	for i := uint64(1); i+span <= entries; i++ {
		if err := ls.compact(i); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("compact through %d: %v", i, err)
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d reads during %d compactions, %d saw ErrCompacted", reads.Load(), entries-span, compactedSeen.Load())
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d of %d reads during compaction failed with an error raft panics on; first: %v", n, reads.Load(), firstBad.Load())
	}
	if first, _ := ls.FirstIndex(); first != entries-span+1 {
		t.Fatalf("the log starts at %d after compacting; want %d", first, entries-span+1)
	}
}

// A follower that comes back after a short absence is caught up from the
// leader's log file while the leader, under a stream of pushes, snapshots
// and compacts that log every MiB; the follower ends with the leader's
// state. (Before compaction moved the log's start first, the leader's
// ready loop panicked on "log not found" in 6 of 12 runs.)
func TestFollowerCatchesUpWhileTheLeaderCompacts(t *testing.T) {
	tc := startClusterWith(t, 3, func(_ int, c *Config) {
		c.SnapshotLogBytes, c.TrailingLogBytes = 1<<20, 1<<20
		c.SnapshotInterval = time.Hour
		c.WALSegmentSize = 128 << 10
	})
	l := tc.leader()
	ctx := ctxT(t, 120*time.Second)
	payload := []byte(`"` + strings.Repeat("x", 16<<10) + `"`)
	var (
		stop     atomic.Bool
		seq, oks atomic.Int64
		wg       sync.WaitGroup
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				i := seq.Add(1)
				// An election under load fails some; the count says whether enough went in.
				v, err := l.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: fmt.Sprintf("t%d", i), Payload: payload}}}, 64)
				if r, ok := v.(*state.PushResult); err == nil && ok && r.Err == nil {
					oks.Add(1)
				}
			}
		}()
	}
	away := tc.indexOf(tc.follower())
	snapsBefore := l.logs.snapshotIndex()
	for round := 0; round < 6; round++ {
		if err := tc.nodes[away].Close(); err != nil {
			t.Fatal(err)
		}
		tc.nodes[away] = nil
		time.Sleep(300 * time.Millisecond)
		n, err := Open(tc.cfgs[away])
		if err != nil {
			t.Fatalf("reopen %s: %v", tc.cfgs[away].NodeID, err)
		}
		tc.nodes[away] = n
		time.Sleep(700 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	first, _ := l.logs.FirstIndex()
	t.Logf("%d of %d pushes answered; the leader's snapshot moved from %d to %d, its log starts at %d", oks.Load(), seq.Load(), snapsBefore, l.logs.snapshotIndex(), first)
	if oks.Load() < 64 || l.logs.snapshotIndex() == snapsBefore {
		t.Fatalf("%d pushes answered, snapshot at %d (was %d): too few to compact the log under the follower's catch-up", oks.Load(), l.logs.snapshotIndex(), snapsBefore)
	}
	back := tc.nodes[away]
	// Compared at one applied index that neither store moves past while
	// its checksum is taken (as disk_test does); a real divergence never
	// compares equal and names the first key that differs.
	if err := checkFor(20*time.Second, func() error {
		li, bi := l.AppliedIndex(), back.AppliedIndex()
		if bi != li {
			return fmt.Errorf("follower back applied %d, leader %d", bi, li)
		}
		want, err := l.Store().Checksum()
		if err != nil {
			return err
		}
		got, err := back.Store().Checksum()
		if err != nil {
			return err
		}
		if l.AppliedIndex() != li || back.AppliedIndex() != bi {
			return fmt.Errorf("an entry was applied while the checksums were taken (at %d)", li)
		}
		if got != want {
			return fmt.Errorf("follower back has checksum %x at %d, leader %x: %s", got, bi, want, firstStateDiff(back.Store().DB(), l.Store().DB()))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// firstStateDiff names the first key (past the meta record, before the
// state's table limit, as Checksum reads them) at which a and b differ.
func firstStateDiff(a, b *pebble.DB) string {
	opts := &pebble.IterOptions{LowerBound: []byte{0x02}, UpperBound: []byte{0x15}}
	ia, err := a.NewIter(opts)
	if err != nil {
		return err.Error()
	}
	defer ia.Close()
	ib, err := b.NewIter(opts)
	if err != nil {
		return err.Error()
	}
	defer ib.Close()
	okA, okB := ia.First(), ib.First()
	for okA && okB {
		if !bytes.Equal(ia.Key(), ib.Key()) || !bytes.Equal(ia.Value(), ib.Value()) {
			return fmt.Sprintf("first difference: key %x = %x against key %x = %x", ia.Key(), ia.Value(), ib.Key(), ib.Value())
		}
		okA, okB = ia.Next(), ib.Next()
	}
	switch {
	case okA:
		return fmt.Sprintf("the first store has more keys, from %x", ia.Key())
	case okB:
		return fmt.Sprintf("the second store has more keys, from %x", ib.Key())
	}
	return "no key differs now"
}
