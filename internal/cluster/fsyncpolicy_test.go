package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	raftwal "github.com/hashicorp/raft-wal"

	"github.com/queen-mq/queen/internal/state"
)

func TestFsyncSettingsParse(t *testing.T) {
	for in, want := range map[string]FsyncMode{"": FsyncAlways, "always": FsyncAlways, "interval": FsyncInterval} {
		got, err := ParseFsyncMode(in)
		if err != nil || got != want {
			t.Errorf("ParseFsyncMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"never", "Always", "batch", " interval"} {
		if _, err := ParseFsyncMode(in); err == nil || !strings.Contains(err.Error(), "QUEEN_FSYNC") {
			t.Errorf("ParseFsyncMode(%q) = %v; want an error naming QUEEN_FSYNC", in, err)
		}
	}
	for _, ms := range []int64{1, 100, 10000} {
		if d, err := FsyncIntervalFromMS(ms); err != nil || d != time.Duration(ms)*time.Millisecond {
			t.Errorf("FsyncIntervalFromMS(%d) = %v, %v", ms, d, err)
		}
	}
	for _, ms := range []int64{0, -5, 10001, 1 << 62} {
		if _, err := FsyncIntervalFromMS(ms); err == nil || !strings.Contains(err.Error(), "QUEEN_FSYNC_INTERVAL_MS") {
			t.Errorf("FsyncIntervalFromMS(%d) = %v; want an error naming QUEEN_FSYNC_INTERVAL_MS", ms, err)
		}
	}
}

func storeEntries(t *testing.T, wal *raftwal.WAL, from, to uint64) {
	t.Helper()
	var logs []*walRecord
	for i := from; i <= to; i++ {
		logs = append(logs, &walRecord{Index: i, Term: 1, Type: walCommand, Data: []byte(fmt.Sprintf("entry %d", i))})
	}
	if err := wal.StoreLogs(logs); err != nil {
		t.Fatalf("store entries %d-%d: %v", from, to, err)
	}
}

// With interval, an append returns before it is synced; a sync of Pebble's
// state syncs the log first; close syncs what is left, and the log reads
// back whole.
func TestIntervalDefersLogSync(t *testing.T) {
	dir := t.TempDir()
	s := newLogSyncer(FsyncInterval, 10*time.Second, quietLogger())
	wal, err := s.openWAL(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	storeEntries(t, wal, 1, 5)
	time.Sleep(50 * time.Millisecond)
	if got := s.Synced(); got != 0 {
		t.Fatalf("synced = %d right after the appends; want 0 (the fsync deferred)", got)
	}

	fs := s.pebbleFS(nil)
	if fs == nil {
		t.Fatal("no Pebble file system for interval")
	}
	f, err := fs.Create(filepath.Join(t.TempDir(), "MANIFEST"), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := s.Synced(); got != 5 {
		t.Fatalf("synced = %d after a Pebble file sync; want 5 (the log reaches the disk before the state)", got)
	}
	if r := s.rounds.Load(); r != 1 {
		t.Fatalf("sync rounds = %d; want 1", r)
	}

	storeEntries(t, wal, 6, 9)
	if got := s.Synced(); got != 5 {
		t.Fatalf("synced = %d; want 5", got)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if got := s.Synced(); got != 9 {
		t.Fatalf("synced = %d after close; want 9", got)
	}
	if err := wal.Close(); err != nil {
		t.Fatal(err)
	}

	wal2, err := raftwal.Open(dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer wal2.Close()
	last, err := wal2.LastIndex()
	if err != nil || last != 9 {
		t.Fatalf("reopened log: last index %d, %v; want 9", last, err)
	}
	var l walRecord
	if err := wal2.GetLog(7, &l); err != nil || string(l.Data) != "entry 7" {
		t.Fatalf("entry 7 = %q, %v", l.Data, err)
	}
}

// The syncer runs at least once per interval while the log is written, and
// the synced index catches up with the log without anyone asking.
func TestIntervalSyncerKeepsTime(t *testing.T) {
	const interval = 20 * time.Millisecond
	s := newLogSyncer(FsyncInterval, interval, quietLogger())
	wal, err := s.openWAL(t.TempDir(), 64<<10) // small segments: rotations too
	if err != nil {
		t.Fatal(err)
	}
	defer wal.Close()
	defer s.close()
	start := time.Now()
	next := uint64(1)
	for time.Since(start) < time.Second {
		storeEntries(t, wal, next, next+9)
		next += 10
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	rounds := s.rounds.Load()
	t.Logf("%d entries in %v, %d sync rounds (interval %v)", next-1, elapsed, rounds, interval)
	if min := uint64(elapsed / interval / 4); rounds < min {
		t.Errorf("%d sync rounds in %v; want at least %d (one per %v, with slack for a loaded machine)", rounds, elapsed, min, interval)
	}
	deadline := time.Now().Add(2 * time.Second)
	for s.Synced() < next-1 {
		if time.Now().After(deadline) {
			t.Fatalf("synced = %d, log at %d, 2s after the last append", s.Synced(), next-1)
		}
		time.Sleep(interval / 2)
	}
	s.rmu.Lock()
	segs := len(s.files)
	s.rmu.Unlock()
	if segs == 0 {
		t.Errorf("no open segment tracked")
	}
}

func startFsyncCluster(t *testing.T, size int, mode FsyncMode, interval time.Duration) *testCluster {
	t.Helper()
	tc := &testCluster{t: t}
	var peers []Peer
	for i := 0; i < size; i++ {
		addr := freeAddr(t)
		tc.cfgs = append(tc.cfgs, Config{DataDir: filepath.Join(t.TempDir(), fmt.Sprintf("n%d", i+1)), NodeID: fmt.Sprintf("n%d", i+1), RaftAddr: addr,
			HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger(),
			Fsync: mode, FsyncInterval: interval})
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i+1), Address: addr})
	}
	for i := range tc.cfgs {
		tc.cfgs[i].Peers = peers
		n, err := Open(tc.cfgs[i])
		if err != nil {
			t.Fatal(err)
		}
		tc.nodes = append(tc.nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range tc.nodes {
			n.Close()
		}
	})
	tc.leader()
	return tc
}

// With interval and a period far longer than the test, a write is
// acknowledged unsynced, and WaitSynced on a follower returns once a
// majority of the voters have synced it (it asks them to sync early).
func TestWaitSyncedReachesAMajority(t *testing.T) {
	tc := startFsyncCluster(t, 3, FsyncInterval, 10*time.Second)
	l := tc.leader()
	f := tc.follower()
	ctx := ctxT(t, 20*time.Second)
	for i := 0; i < 5; i++ {
		if _, err := f.Submit(ctx, kvPut(fmt.Sprintf("k%d", i), `"v"`, nil), 64); err != nil {
			t.Fatalf("submit: %v", err)
		}
	}
	idx := l.CommitIndex()
	if got := l.Synced(); got >= idx {
		t.Fatalf("leader synced through %d, commit index %d: the appends were not deferred", got, idx)
	}
	start := time.Now()
	if err := f.WaitSynced(ctx); err != nil {
		t.Fatalf("wait synced: %v", err)
	}
	took := time.Since(start)
	if took > 5*time.Second {
		t.Errorf("WaitSynced took %v: the voters did not sync early", took)
	}
	synced := 0
	for _, n := range tc.nodes {
		if n.Synced() >= idx {
			synced++
		}
	}
	t.Logf("WaitSynced took %v; %d of 3 nodes synced through %d", took, synced, idx)
	if synced < 2 {
		t.Fatalf("%d of 3 nodes synced through %d after WaitSynced; want a majority", synced, idx)
	}
	// The state reads back on every node.
	for _, n := range tc.nodes {
		if err := n.ReadBarrier(ctx); err != nil {
			t.Fatal(err)
		}
		rd := n.Store().Reader()
		_, ok := rd.KVGet("default", "k4", time.Now().UnixMicro())
		rd.Close()
		if !ok {
			t.Errorf("%s: k4 missing", n.ID())
		}
	}
}

// With always, every acknowledged write is already synced: WaitSynced
// returns at once and Synced is the log's last index.
func TestAlwaysIsSyncedOnReply(t *testing.T) {
	tc := startFsyncCluster(t, 1, FsyncAlways, 0)
	n := tc.leader()
	ctx := ctxT(t, 10*time.Second)
	v, err := n.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: "t1", Payload: []byte(`1`)}}}, 64)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := v.(*state.PushResult); !ok || r.Err != nil {
		t.Fatalf("push: %+v", v)
	}
	last, _ := n.wal.LastIndex()
	if got := n.Synced(); got != last {
		t.Fatalf("synced = %d, last index %d", got, last)
	}
	c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := n.WaitSynced(c); err != nil {
		t.Fatalf("WaitSynced with always: %v", err)
	}
}
