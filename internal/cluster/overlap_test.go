package cluster

import (
	"fmt"
	"sync"
	"testing"
	"time"

	walfs "github.com/hashicorp/raft-wal/fs"
	waltypes "github.com/hashicorp/raft-wal/types"
)

// gateVFS is raft-wal's file system with a gate on the segment files'
// fsyncs: once armed, the next fsync reports itself and waits until it is
// released.
type gateVFS struct {
	waltypes.VFS
	mu      sync.Mutex
	hold    chan struct{} // non-nil while armed
	entered chan struct{}
}

func (v *gateVFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return &gateFile{WritableFile: f, v: v}, nil
}

func (v *gateVFS) OpenWriter(dir, name string) (waltypes.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return &gateFile{WritableFile: f, v: v}, nil
}

// arm makes the next fsync wait; the returned func releases it.
func (v *gateVFS) arm() func() {
	hold := make(chan struct{})
	v.mu.Lock()
	v.hold = hold
	v.mu.Unlock()
	return func() { close(hold) }
}

type gateFile struct {
	waltypes.WritableFile
	v *gateVFS
}

func (f *gateFile) Sync() error {
	f.v.mu.Lock()
	hold := f.v.hold
	f.v.hold = nil
	f.v.mu.Unlock()
	if hold != nil {
		f.v.entered <- struct{}{}
		<-hold
	}
	return f.WritableFile.Sync()
}

// TestApplyAndProposalsOverlapAnFsync: while the leader's log fsync of one
// entry runs, the node keeps taking proposals, and an entry whose own
// fsync is done is applied and answered while the fsync of the next one
// is still running. (With hashicorp/raft the leader loop did neither: it
// waited in the log write, so the second proposal was not taken, and the
// first entry's commit waited for the second's fsync whenever the loop
// took the new proposal first.)
func TestApplyAndProposalsOverlapAnFsync(t *testing.T) {
	gate := &gateVFS{VFS: walfs.New(), entered: make(chan struct{}, 1)}
	tc := startClusterWith(t, 1, func(i int, c *Config) {
		c.WALFS = gate
		c.Fsync, c.FsyncInterval = FsyncAlways, 10*time.Second
		c.SnapshotThreshold, c.SnapshotInterval = 1<<30, time.Hour
	})
	n := tc.leader()
	ctx := ctxT(t, 30*time.Second)
	for round := 0; round < 5; round++ {
		release1 := gate.arm()
		resA := make(chan error, 1)
		go func() {
			_, err := n.Submit(ctx, kvPut(fmt.Sprintf("a%d", round), `1`, nil), 64)
			resA <- err
		}()
		select {
		case <-gate.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the first entry's fsync never started", round)
		}
		resB := make(chan error, 1)
		go func() {
			_, err := n.Submit(ctx, kvPut(fmt.Sprintf("b%d", round), `1`, nil), 64)
			resB <- err
		}()
		// The second proposal is taken by raft while the first fsync runs.
		if err := checkFor(5*time.Second, func() error {
			if c := proposedCount(n); c < 2 {
				return fmt.Errorf("%d of 2 entries proposed while the first entry's fsync runs", c)
			}
			return nil
		}); err != nil {
			release1()
			t.Fatalf("round %d: %v", round, err)
		}
		release2 := gate.arm()
		release1()
		// The first entry is answered while the second one's fsync runs.
		select {
		case <-gate.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the second entry's fsync never started", round)
		}
		select {
		case err := <-resA:
			if err != nil {
				t.Fatalf("round %d: first submit: %v", round, err)
			}
		case <-time.After(5 * time.Second):
			release2()
			t.Fatalf("round %d: the first entry was not answered while the second entry's fsync ran", round)
		}
		select {
		case err := <-resB:
			release2()
			t.Fatalf("round %d: the second entry was answered before its fsync ended (err %v)", round, err)
		default:
		}
		release2()
		if err := <-resB; err != nil {
			t.Fatalf("round %d: second submit: %v", round, err)
		}
	}
}

// proposedCount is how many of this node's unanswered proposals raft
// took: pending, or applied with their reply waiting for the fsync.
func proposedCount(n *Node) int {
	n.dedup.mu.Lock()
	c := 0
	for _, p := range n.dedup.pending {
		if p.proposed.Load() {
			c++
		}
	}
	n.dedup.mu.Unlock()
	return c + n.replies.parked()
}
