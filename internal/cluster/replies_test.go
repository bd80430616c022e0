package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	waltypes "github.com/hashicorp/raft-wal/types"

	"github.com/queen-mq/queen/internal/state"
)

// holdVFS is raft-wal's file system whose segment fsyncs, once held, wait
// until they are released, and then fail with the error given, if any.
type holdVFS struct {
	waltypes.VFS
	mu      sync.Mutex
	gate    chan struct{} // non-nil while held
	err     error         // what the held fsyncs return once released
	entered chan struct{} // one send per fsync that starts waiting
}

func newHoldVFS() *holdVFS {
	return &holdVFS{VFS: walfs.New(), entered: make(chan struct{}, 64)}
}

func (v *holdVFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return &holdFile{WritableFile: f, v: v}, nil
}

func (v *holdVFS) OpenWriter(dir, name string) (waltypes.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return &holdFile{WritableFile: f, v: v}, nil
}

// hold makes every fsync from now on wait; release lets them go, failing
// with err when it is not nil.
func (v *holdVFS) hold() (release func(err error)) {
	gate := make(chan struct{})
	v.mu.Lock()
	v.gate, v.err = gate, nil
	v.mu.Unlock()
	var once sync.Once
	return func(err error) {
		once.Do(func() {
			v.mu.Lock()
			v.gate, v.err = nil, err
			v.mu.Unlock()
			close(gate)
		})
	}
}

type holdFile struct {
	waltypes.WritableFile
	v *holdVFS
}

func (f *holdFile) Sync() error {
	f.v.mu.Lock()
	gate := f.v.gate
	f.v.mu.Unlock()
	if gate != nil {
		select {
		case f.v.entered <- struct{}{}:
		default:
		}
		<-gate
		f.v.mu.Lock()
		err := f.v.err
		f.v.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return f.WritableFile.Sync()
}

// startHeldCluster starts three nodes under always whose log fsyncs can be
// held, and returns the leader's file system.
func startHeldCluster(t *testing.T) (*testCluster, *holdVFS) {
	t.Helper()
	vfss := make([]*holdVFS, 3)
	tc := startClusterWith(t, 3, func(i int, c *Config) {
		vfss[i] = newHoldVFS()
		c.WALFS = vfss[i]
		c.Fsync, c.FsyncInterval = FsyncAlways, 10*time.Second // no syncer round but on demand
		c.SnapshotThreshold, c.SnapshotInterval = 1<<30, time.Hour
	})
	return tc, vfss[tc.indexOf(tc.leader())]
}

func waitEntered(t *testing.T, v *holdVFS, what string) {
	t.Helper()
	select {
	case <-v.entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("no fsync of the leader's log started after %s", what)
	}
}

// waitAppliedPast waits until n has applied an entry after past and its
// log's last index, and returns that index.
func waitAppliedPast(t *testing.T, n *Node, past uint64, what string) uint64 {
	t.Helper()
	var idx uint64
	if err := checkFor(10*time.Second, func() error {
		idx = n.LastIndex()
		if a := n.Store().AppliedIndex(); a <= past || a < idx {
			return fmt.Errorf("applied %d; want past %d and through %d", a, past, idx)
		}
		return nil
	}); err != nil {
		t.Fatalf("%s: the leader did not apply it while its fsync was held: %v", what, err)
	}
	return idx
}

type submitted struct {
	v   any
	err error
}

func submitAsync(ctx context.Context, n *Node, cmd state.Command) <-chan submitted {
	ch := make(chan submitted, 1)
	go func() {
		v, err := n.Submit(ctx, cmd, 256)
		ch <- submitted{v, err}
	}()
	return ch
}

// notYet fails the test if a reply comes within a short while.
func notYet(t *testing.T, ch <-chan submitted, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s was answered while the leader's fsync of its entry was held: %+v", what, r)
	case <-time.After(200 * time.Millisecond):
	}
}

// Under always, the leader applies a push while its own fsync of the
// push's entry is held, and answers it only once that fsync returned.
func TestAlwaysReplyWaitsForTheLeadersFsync(t *testing.T) {
	tc, lv := startHeldCluster(t)
	l := tc.leader()
	ctx := ctxT(t, 30*time.Second)
	if r := submitOK[*state.PushResult](t, ctx, l, pushN("q", "p", 0, 1)); r.Err != nil {
		t.Fatalf("push: %+v", r.Err)
	}
	tc.waitApplied(10 * time.Second)

	past := l.LastIndex()
	release := lv.hold()
	defer release(nil)
	res := submitAsync(ctx, l, pushN("q", "p", 1, 2))
	waitEntered(t, lv, "a push")
	idx := waitAppliedPast(t, l, past, "push")
	if s := l.Synced(); s >= idx {
		t.Fatalf("the leader's log is synced through %d, the push is at %d: the fsync held was not the push's", s, idx)
	}
	notYet(t, res, "the push")
	release(nil)
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("push: %v", r.err)
		}
		if pr, ok := r.v.(*state.PushResult); !ok || pr.Err != nil {
			t.Fatalf("push: %#v", r.v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the push was not answered after its fsync returned")
	}
	if s := l.Synced(); s < idx {
		t.Fatalf("answered with the leader's log synced through %d, the push at %d", s, idx)
	}
}

// Under always, a leasing pop proposed while the leader's fsync of an ack
// is held is answered at once; the ack once the fsync returned.
func TestAlwaysLeasePopDoesNotWaitForAnAcksFsync(t *testing.T) {
	tc, lv := startHeldCluster(t)
	l := tc.leader()
	ctx := ctxT(t, 30*time.Second)
	for _, p := range []string{"p1", "p2"} {
		if r := submitOK[*state.PushResult](t, ctx, l, pushN("q", p, 0, 2)); r.Err != nil {
			t.Fatalf("push: %+v", r.Err)
		}
	}
	p1 := "p1"
	first := leasePop("q", "g", 1, 60)
	first.Partition = &p1
	popped := submitOK[*state.PopResult](t, ctx, l, first)
	if popped.Err != nil || len(popped.Messages) != 1 {
		t.Fatalf("pop: %+v", popped)
	}
	tc.waitApplied(10 * time.Second)

	release := lv.hold()
	defer release(nil)
	m := popped.Messages[0]
	ack := submitAsync(ctx, l, &state.Ack{Tenant: "default", Items: []state.AckItem{{PartitionID: m.PartitionID, TxID: m.TxID, Status: state.AckCompleted, Group: "g", LeaseID: popped.LeaseID}}})
	waitEntered(t, lv, "an ack")
	p2 := "p2"
	second := leasePop("q", "g", 1, 60)
	second.Partition = &p2
	popCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := l.Submit(popCtx, second, 256)
	if err != nil {
		t.Fatalf("a leasing pop behind the held fsync of an ack: %v", err)
	}
	if r, ok := v.(*state.PopResult); !ok || r.Err != nil || len(r.Messages) != 1 {
		t.Fatalf("pop: %#v", v)
	}
	notYet(t, ack, "the ack")
	release(nil)
	select {
	case r := <-ack:
		if r.err != nil {
			t.Fatalf("ack: %v", r.err)
		}
		if ar, ok := r.v.(*state.AckResult); !ok || ar.Err != nil || len(ar.Items) != 1 || !ar.Items[0].Success {
			t.Fatalf("ack: %#v", r.v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the ack was not answered after its fsync returned")
	}
}

// Under always, a failed fsync of the leader's log fails the replies
// waiting for it, never answers them OK, and stops the node.
func TestAlwaysFailedFsyncFailsWaitingReplies(t *testing.T) {
	tc, lv := startHeldCluster(t)
	l := tc.leader()
	ctx := ctxT(t, 30*time.Second)
	if r := submitOK[*state.PushResult](t, ctx, l, pushN("q", "p", 0, 1)); r.Err != nil {
		t.Fatalf("push: %+v", r.Err)
	}
	tc.waitApplied(10 * time.Second)

	past := l.LastIndex()
	release := lv.hold()
	defer release(nil)
	push := submitAsync(ctx, l, pushN("q", "p", 1, 2))
	put := submitAsync(ctx, l, kvPut("k", `1`, nil))
	waitEntered(t, lv, "a push and a put")
	waitAppliedPast(t, l, past, "push and put")
	notYet(t, push, "the push")
	release(errors.New("injected: the disk is gone"))
	for what, ch := range map[string]<-chan submitted{"push": push, "put": put} {
		select {
		case r := <-ch:
			if r.err == nil {
				t.Fatalf("%s answered OK after the fsync of its entry failed: %#v", what, r.v)
			}
			if !errors.Is(r.err, ErrStopped) {
				t.Fatalf("%s: %v; want the node's stop (ErrStopped)", what, r.err)
			}
			t.Logf("%s: %v", what, r.err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer after the fsync of its entry failed", what)
		}
	}
	select {
	case <-l.Halted():
	case <-time.After(10 * time.Second):
		t.Fatal("the leader runs on after a failed fsync of its log")
	}
	if err := l.HaltError(); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("halt error %v; want the fsync's", err)
	}
	if _, err := l.Submit(ctx, kvPut("k2", `1`, nil), 64); err == nil {
		t.Fatal("a write on the stopped node succeeded")
	}
}

// A power loss of every node under always, right after acknowledged writes
// while more are in flight, and while the leader's fsync is held with
// entries applied but not on its disk: every acknowledged write survives.
// One follower is down during the writes, so each commit counts the leader
// and the other follower; after the power loss the leader comes back with
// the node that was down, without that other follower. An acknowledged
// write the leader had counted but not synced would be gone.
func TestAlwaysPowerLossKeepsAcknowledgedWrites(t *testing.T) {
	const size = 3
	lossy := make([]*lossyVFS, size)
	holds := make([]*holdVFS, size)
	mems := make([]*vfs.MemFS, size)
	tc := startClusterWith(t, size, func(i int, c *Config) {
		lossy[i] = &lossyVFS{VFS: walfs.New()}
		holds[i] = &holdVFS{VFS: lossy[i], entered: make(chan struct{}, 64)}
		mems[i] = vfs.NewCrashableMem()
		c.WALFS, c.WALMeta, c.StoreFS = holds[i], &lossyMeta{MetaStore: &metadb.BoltMetaDB{}, v: lossy[i]}, mems[i]
		c.Fsync, c.FsyncInterval = FsyncAlways, 10*time.Second
		c.SnapshotThreshold, c.SnapshotInterval = 1<<30, time.Hour
	})
	ctx := ctxT(t, 90*time.Second)
	l := tc.leader()
	li := tc.indexOf(l)
	down := (li + 1) % size
	other := (li + 2) % size
	if r := submitOK[*state.PushResult](t, ctx, l, pushN("q", "warm", 0, 1)); r.Err != nil {
		t.Fatalf("push: %+v", r.Err)
	}
	tc.waitApplied(10 * time.Second)
	tc.nodes[down].Close()
	tc.nodes[down] = nil

	const writers = 4
	var (
		cut   atomic.Bool
		mu    sync.Mutex
		acked = map[string]bool{}
		wg    sync.WaitGroup
	)
	wctx, stop := context.WithCancel(ctx)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := fmt.Sprintf("w%d", w)
			for i := 0; wctx.Err() == nil; i++ {
				v, err := l.Submit(wctx, pushN("q", part, i, i+1), 64)
				if err != nil {
					return
				}
				// Answered before the power was cut: it must survive.
				if r, ok := v.(*state.PushResult); ok && r.Err == nil && !cut.Load() {
					mu.Lock()
					acked[fmt.Sprintf("%s-%d", part, i)] = true
					mu.Unlock()
				}
			}
		}()
	}
	if err := checkFor(20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(acked) < 200 {
			return fmt.Errorf("%d writes acknowledged", len(acked))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The leader's fsync is held until it has applied writes that are not
	// on its disk; then the power goes off on it and on the follower with
	// it, while writes are in flight.
	release := holds[li].hold()
	defer release(nil)
	waitEntered(t, holds[li], "writes")
	if err := checkFor(10*time.Second, func() error {
		if a, s := l.Store().AppliedIndex(), l.Synced(); a <= s {
			return fmt.Errorf("applied %d, synced %d", a, s)
		}
		return nil
	}); err != nil {
		t.Fatalf("the leader applied nothing past its synced index while its fsync was held: %v", err)
	}
	cut.Store(true)
	clones := make([]*vfs.MemFS, size)
	for _, i := range []int{li, other} {
		clones[i] = mems[i].CrashClone(vfs.CrashCloneCfg{})
		synced, applied, last := tc.nodes[i].Synced(), tc.nodes[i].Store().AppliedIndex(), tc.nodes[i].LastIndex()
		t.Logf("%s: %d unsynced log writes lost (synced through %d, applied %d, written %d)", tc.nodes[i].ID(), lossy[i].crash(), synced, applied, last)
	}
	release(nil)
	stop()
	for _, i := range []int{li, other} {
		tc.nodes[i].Close()
		tc.nodes[i] = nil
	}
	wg.Wait()
	clones[down] = mems[down].CrashClone(vfs.CrashCloneCfg{})
	mu.Lock()
	t.Logf("%d writes acknowledged before the power loss", len(acked))
	mu.Unlock()

	// The leader comes back with the node that was down; the follower
	// that counted in the commits stays off.
	for _, i := range []int{li, down} {
		tc.cfgs[i].WALFS, tc.cfgs[i].WALMeta, tc.cfgs[i].StoreFS = nil, nil, clones[i]
		n, err := Open(tc.cfgs[i])
		if err != nil {
			t.Fatalf("reopen %s after the power loss: %v", tc.cfgs[i].NodeID, err)
		}
		tc.nodes[i] = n
	}
	nl := tc.leader()
	if r := submitOK[*state.PushResult](t, ctx, nl, pushN("q", "after", 0, 1)); r.Err != nil {
		t.Fatalf("push after the power loss: %+v", r.Err)
	}
	found := map[string]bool{}
	for {
		r := submitOK[*state.PopResult](t, ctx, tc.leader(), &state.Pop{Tenant: "default", Queue: "q", Group: "check", Batch: 1000, Partitions: 16, AutoAck: true, SubMode: "all"})
		if r.Err != nil {
			t.Fatalf("pop: %+v", r.Err)
		}
		if len(r.Messages) == 0 {
			break
		}
		for _, m := range r.Messages {
			found[m.TxID] = true
		}
	}
	if !found["after-0"] || !found["warm-0"] {
		t.Fatalf("the check read %d messages without the first or last push", len(found))
	}
	missing := 0
	for id := range acked {
		if !found[id] {
			missing++
			if missing <= 5 {
				t.Errorf("%s was acknowledged before the power loss and is gone", id)
			}
		}
	}
	t.Logf("%d acknowledged, %d read back after the power loss (unacknowledged writes in flight may be lost or kept)", len(acked), len(found))
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged writes lost", missing, len(acked))
	}
}
