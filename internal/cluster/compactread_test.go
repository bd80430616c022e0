package cluster

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
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
