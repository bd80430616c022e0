package cluster

import (
	"context"
	"fmt"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	waltypes "github.com/hashicorp/raft-wal/types"

	"github.com/queen-mq/queen/internal/state"
)

// countingVFS is the OS's file system counting the fsyncs of the raft
// log's segment files.
type countingVFS struct {
	waltypes.VFS
	syncs atomic.Int64
}

func (v *countingVFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return &countingFile{WritableFile: f, v: v}, nil
}

func (v *countingVFS) OpenWriter(dir, name string) (waltypes.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return &countingFile{WritableFile: f, v: v}, nil
}

type countingFile struct {
	waltypes.WritableFile
	v *countingVFS
}

func (f *countingFile) Sync() error {
	f.v.syncs.Add(1)
	return f.WritableFile.Sync()
}

func leasePop(queue, group string, batch int, leaseSecs int64) *state.Pop {
	return &state.Pop{Tenant: "default", Queue: queue, Group: group, Batch: batch, LeaseSeconds: leaseSecs, LeaseID: uuid.NewString(), SubMode: "all"}
}

func pushN(queue, part string, from, to int) *state.Push {
	p := &state.Push{Tenant: "default"}
	for i := from; i < to; i++ {
		p.Items = append(p.Items, state.PushItem{Queue: queue, Partition: part, TxID: fmt.Sprintf("%s-%d", part, i), Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
	}
	return p
}

func submitOK[R any](t *testing.T, ctx context.Context, n *Node, cmd state.Command) R {
	t.Helper()
	v, err := n.Submit(ctx, cmd, 256)
	if err != nil {
		t.Fatalf("submit %T: %v", cmd, err)
	}
	r, ok := v.(R)
	if !ok {
		t.Fatalf("submit %T: result %#v", cmd, v)
	}
	return r
}

// waitApplied waits until every node has applied the leader's last index.
func (tc *testCluster) waitApplied(within time.Duration) uint64 {
	tc.t.Helper()
	l := tc.leader()
	idx := l.raft.LastIndex()
	deadline := time.Now().Add(within)
	for {
		all := true
		for _, n := range tc.nodes {
			all = all && n.Store().AppliedIndex() >= idx
		}
		if all {
			return idx
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("not every node applied index %d within %v", idx, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Under always, an append of leasing pops is written but not fsynced, on
// the leader and on the followers alike, and the pop is answered; the next
// push is fsynced on every node and makes the pop's entry synced with it;
// an autoAck pop is fsynced before its reply.
func TestAlwaysLeasePopSkipsItsFsync(t *testing.T) {
	counts := make([]*countingVFS, 3)
	tc := startClusterWith(t, 3, func(i int, c *Config) {
		counts[i] = &countingVFS{VFS: walfs.New()}
		c.WALFS = counts[i]
		c.Fsync, c.FsyncInterval = FsyncAlways, 10*time.Second // no syncer round during the test
		c.SnapshotThreshold, c.SnapshotInterval = 1<<30, time.Hour
	})
	ctx := ctxT(t, 20*time.Second)
	l := tc.leader()
	if r := submitOK[*state.PushResult](t, ctx, l, pushN("q", "p", 0, 10)); r.Err != nil {
		t.Fatalf("push: %+v", r.Err)
	}
	tc.waitApplied(10 * time.Second)
	syncs := func() []int64 {
		out := make([]int64, len(counts))
		for i, c := range counts {
			out[i] = c.syncs.Load()
		}
		return out
	}

	before := syncs()
	pop := submitOK[*state.PopResult](t, ctx, l, leasePop("q", "g", 3, 300))
	if pop.Err != nil || len(pop.Messages) != 3 {
		t.Fatalf("pop: %+v", pop)
	}
	popIdx := tc.waitApplied(10 * time.Second)
	after := syncs()
	for i, n := range tc.nodes {
		if after[i] != before[i] {
			t.Errorf("%s: %d fsyncs of the raft log during a leasing pop; want 0", n.ID(), after[i]-before[i])
		}
		if d := n.fsync.deferred.Load(); d == 0 {
			t.Errorf("%s: no deferred append", n.ID())
		}
		if s := n.Synced(); s >= popIdx {
			t.Errorf("%s: synced through %d, the pop is at %d: the pop was synced", n.ID(), s, popIdx)
		}
	}

	before = syncs()
	if r := submitOK[*state.PushResult](t, ctx, l, pushN("q", "p", 10, 11)); r.Err != nil {
		t.Fatalf("push: %+v", r.Err)
	}
	pushIdx := tc.waitApplied(10 * time.Second)
	after = syncs()
	for i, n := range tc.nodes {
		if after[i] <= before[i] {
			t.Errorf("%s: no fsync of the raft log for a push", n.ID())
		}
		if s := n.Synced(); s < pushIdx {
			t.Errorf("%s: synced through %d after the push at %d", n.ID(), s, pushIdx)
		}
	}

	before = syncs()
	auto := submitOK[*state.PopResult](t, ctx, l, &state.Pop{Tenant: "default", Queue: "q", Group: "g2", Batch: 1, AutoAck: true, SubMode: "all"})
	if auto.Err != nil || len(auto.Messages) != 1 {
		t.Fatalf("autoAck pop: %+v", auto)
	}
	// The leader's own fsync comes before it counts the entry, so before
	// the reply.
	if got := counts[tc.indexOf(l)].syncs.Load(); got <= before[tc.indexOf(l)] {
		t.Errorf("leader: the autoAck pop was answered before an fsync of the raft log")
	}
	t.Logf("fsyncs per node: %v; deferred appends per node: %d %d %d", syncs(), tc.nodes[0].fsync.deferred.Load(), tc.nodes[1].fsync.deferred.Load(), tc.nodes[2].fsync.deferred.Load())
}

func (tc *testCluster) indexOf(n *Node) int {
	for i, m := range tc.nodes {
		if m == n {
			return i
		}
	}
	tc.t.Fatalf("node %s is not in the cluster", n.ID())
	return -1
}

// leaseEntry is a raft log entry holding one leasing pop.
func leaseEntry(i uint64) *raft.Log {
	b, err := state.EncodeEntry(&state.Entry{Time: 1, Cmds: []state.Command{&state.Pop{Tenant: "default", Queue: "q", Group: fmt.Sprintf("g%0*d", int(i%2000), 0), Batch: 1, LeaseID: uuid.NewString()}}})
	if err != nil {
		panic(err)
	}
	return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: wrapEntry([]reqID{newReqID()}, b)}
}

// durableEntry is a raft log entry holding a push.
func durableEntry(i uint64) *raft.Log {
	b, err := state.EncodeEntry(&state.Entry{Time: 1, Cmds: []state.Command{pushN("q", fmt.Sprint(i), 0, 1)}})
	if err != nil {
		panic(err)
	}
	return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: wrapEntry(nil, b)}
}

// Under always, a power loss loses at most the lease-only appends after the
// last synced one: the log reopens whole (also when lease-only appends
// sealed segments and rotations committed metadata), it holds every entry
// through the last synced append, and no entry in part.
func TestAlwaysPowerLossLosesOnlyTrailingLeases(t *testing.T) {
	for trial := 0; trial < 5; trial++ {
		seed := time.Now().UnixNano()
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewSource(seed))
			dir := t.TempDir()
			lossy := &lossyVFS{VFS: walfs.New()}
			s := newLogSyncer(FsyncAlways, 10*time.Second, quietLogger())
			s.walVFS = lossy
			s.walMeta = &lossyMeta{MetaStore: &metadb.BoltMetaDB{}, v: lossy}
			wal, err := s.openWAL(dir, 64<<10) // small segments: several rotations
			if err != nil {
				t.Fatal(err)
			}
			log := &syncedLog{WAL: wal, s: s}
			next := uint64(1)
			entries := map[uint64]*raft.Log{}
			var lastDurable uint64
			for round := 0; round < 60; round++ {
				durable := rng.Intn(4) == 0
				var logs []*raft.Log
				for k := rng.Intn(30) + 1; k > 0; k-- {
					e := leaseEntry(next)
					if durable && k == 1 {
						e = durableEntry(next)
					}
					entries[next] = e
					logs = append(logs, e)
					next++
				}
				if err := log.StoreLogs(logs); err != nil {
					t.Fatal(err)
				}
				if durable {
					lastDurable = next - 1
				}
			}
			written := next - 1
			if s.Synced() != lastDurable {
				t.Fatalf("synced = %d; want the last synced append's %d", s.Synced(), lastDurable)
			}
			lost := lossy.crash()
			s.close()
			wal.Close()

			wal2, err := raftwal.Open(dir)
			if err != nil {
				t.Fatalf("reopen after the power loss: %v", err)
			}
			defer wal2.Close()
			last, err := wal2.LastIndex()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("written %d, last synced append %d, %d writes lost, the log reopens at %d", written, lastDurable, lost, last)
			if last < lastDurable || last > written {
				t.Fatalf("log reopens at %d; want between the last synced append %d and the written %d", last, lastDurable, written)
			}
			for i := uint64(1); i <= last; i++ {
				var l raft.Log
				if err := wal2.GetLog(i, &l); err != nil || string(l.Data) != string(entries[i].Data) {
					t.Fatalf("entry %d after the power loss: %v (or its data differs)", i, err)
				}
			}
		})
	}
}

// Under always, a lease-only append is synced by the syncer within its
// interval when no other append comes.
func TestAlwaysSyncerSyncsLeasesWithinInterval(t *testing.T) {
	const interval = 20 * time.Millisecond
	cv := &countingVFS{VFS: walfs.New()}
	s := newLogSyncer(FsyncAlways, interval, quietLogger())
	s.walVFS = cv
	wal, err := s.openWAL(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wal.Close()
	defer s.close()
	log := &syncedLog{WAL: wal, s: s}
	if err := log.StoreLogs([]*raft.Log{durableEntry(1)}); err != nil {
		t.Fatal(err)
	}
	before := cv.syncs.Load()
	start := time.Now()
	if err := log.StoreLogs([]*raft.Log{leaseEntry(2), leaseEntry(3)}); err != nil {
		t.Fatal(err)
	}
	if got := cv.syncs.Load(); got != before {
		t.Fatalf("%d fsyncs for a lease-only append; want 0", got-before)
	}
	if got := s.Synced(); got != 1 {
		t.Fatalf("synced = %d right after the lease-only append; want 1", got)
	}
	for s.Synced() < 3 {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("synced = %d 2s after a lease-only append at 3 (interval %v)", s.Synced(), interval)
		}
		time.Sleep(interval / 4)
	}
	t.Logf("the lease-only append was synced %v after it, interval %v", time.Since(start), interval)
	if cv.syncs.Load() == before {
		t.Fatal("synced without an fsync")
	}
}
