package cluster

import (
	"sync"
	"testing"
	"time"

	walfs "github.com/hashicorp/raft-wal/fs"

	"github.com/queen-mq/queen/internal/state"
)

// TestPushWakesPopsBeforeItsFsync: the leader wakes the long-polling pops
// of a queue as soon as a push to it is in its log, while the push's
// fsync still runs, so that a pop proposed then is written right behind
// it. The push itself is answered only after its fsync, and the state
// machine wakes the queue again when it applies the push. (Before, the
// only wake came from the apply, after the fsync.)
func TestPushWakesPopsBeforeItsFsync(t *testing.T) {
	gate := &gateVFS{VFS: walfs.New(), entered: make(chan struct{}, 1)}
	var mu sync.Mutex
	woken := map[state.Wake]int{}
	wakes := make(chan struct{}, 16)
	tc := startClusterWith(t, 1, func(i int, c *Config) {
		c.WALFS = gate
		c.Fsync = FsyncAlways
		c.OnWake = func(ws []state.Wake) {
			mu.Lock()
			for _, w := range ws {
				woken[w]++
			}
			mu.Unlock()
			select {
			case wakes <- struct{}{}:
			default:
			}
		}
	})
	n := tc.leader()
	ctx := ctxT(t, 30*time.Second)
	want := state.Wake{Tenant: "default", Queue: "wq"}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return woken[want]
	}
	push := &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "wq", Partition: "p", TxID: "t1", Payload: []byte(`1`)}}}
	release := gate.arm()
	res := make(chan error, 1)
	go func() {
		_, err := n.Submit(ctx, push, 64)
		res <- err
	}()
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		release()
		t.Fatal("the push's fsync never started")
	}
	// The fsync is held: the queue's waiters must be woken meanwhile.
	if err := checkFor(5*time.Second, func() error {
		if c := count(); c < 1 {
			return errNotYet("the queue was not woken while the push's fsync ran")
		}
		return nil
	}); err != nil {
		release()
		t.Fatal(err)
	}
	select {
	case err := <-res:
		release()
		t.Fatalf("the push was answered before its fsync ended (err %v)", err)
	default:
	}
	release()
	if err := <-res; err != nil {
		t.Fatalf("push: %v", err)
	}
	// The apply wakes it once more.
	if err := checkFor(5*time.Second, func() error {
		if c := count(); c < 2 {
			return errNotYet("the apply did not wake the queue")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }
