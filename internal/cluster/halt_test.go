package cluster

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/queen-mq/queen/internal/state"
)

// waitHalted waits until n stopped applying the log.
func waitHalted(t *testing.T, n *Node, within time.Duration) error {
	t.Helper()
	select {
	case <-n.Halted():
		return n.HaltError()
	case <-time.After(within):
		t.Fatalf("%s did not stop within %v (applied %d)", n.ID(), within, n.AppliedIndex())
		return nil
	}
}

// checkRefuses checks that a stopped node refuses writes and reads at once
// and reports itself unable to serve.
func checkRefuses(t *testing.T, n *Node) {
	t.Helper()
	start := time.Now()
	if _, err := n.Submit(ctxT(t, 10*time.Second), kvPut("after", `"x"`, nil), 64); !errors.Is(err, ErrStopped) {
		t.Errorf("%s: a write after the stop returned %v, want ErrStopped", n.ID(), err)
	}
	if err := n.ReadBarrier(ctxT(t, 10*time.Second)); !errors.Is(err, ErrStopped) {
		t.Errorf("%s: a read barrier after the stop returned %v, want ErrStopped", n.ID(), err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("%s: refusing took %v, want at once", n.ID(), d)
	}
	if n.CanServe() || n.IsLeader() {
		t.Errorf("%s: a stopped node says it can serve (leader %v)", n.ID(), n.IsLeader())
	}
}

// TestUnknownCommandStopsEveryNode: a log entry of a kind this version does
// not know (a newer leader's) stops each node with "upgrade it", instead of
// being skipped; stopped nodes refuse reads and writes, and close promptly.
func TestUnknownCommandStopsEveryNode(t *testing.T) {
	tc := startCluster(t, 3)
	l := tc.leader()
	if _, err := l.Submit(ctxT(t, 10*time.Second), kvPut("k", `"v"`, nil), 64); err != nil {
		t.Fatal(err)
	}
	// Version 1, a time, one command of kind 250 with an empty body.
	entry := []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 250, 0}
	// Its proposer is answered only once the node closes: the state
	// machine stops at it.
	if err := l.proposeRaw(wrapEntry([]reqID{newReqID()}, entry)); err != nil {
		t.Fatal(err)
	}
	for _, n := range tc.nodes {
		err := waitHalted(t, n, 10*time.Second)
		if !errors.Is(err, ErrStopped) || !errors.Is(err, state.ErrUnknownCommand) || !strings.Contains(err.Error(), "this node is older than the cluster: upgrade it") {
			t.Errorf("%s stopped with %v, want the upgrade error", n.ID(), err)
		}
		checkRefuses(t, n)
	}
	for i, n := range tc.nodes {
		done := make(chan error, 1)
		go func() { done <- n.Close() }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Fatalf("closing the stopped node %s hangs", n.ID())
		}
		tc.nodes[i] = nil
	}
}

// TestStorageErrorStopsOneNode: a read error in one follower's store
// (Pebble's errorfs on its table files) stops that follower, with the key
// in its error; the other two keep taking writes. Restarted without the
// fault, it applies the entry again and ends with the leader's checksum.
func TestStorageErrorStopsOneNode(t *testing.T) {
	tc := startCluster(t, 3)
	ctx := ctxT(t, 60*time.Second)
	l := tc.leader()
	// Enough keys for many table blocks, so that a later read misses the
	// block cache of a freshly opened store.
	for i := 0; i < 100; i++ {
		ops := make([]state.TxnOp, 20)
		for j := range ops {
			ops[j] = state.TxnOp{Type: state.OpKVPut, Key: fmt.Sprintf("k%05d", i*20+j), Value: []byte(fmt.Sprintf(`"%s"`, strings.Repeat("v", 100)))}
		}
		if _, err := l.Submit(ctx, &state.Txn{Tenant: "default", Ops: ops}, 4096); err != nil {
			t.Fatal(err)
		}
	}
	fi := 0
	for i, n := range tc.nodes {
		if n != l {
			fi = i
			break
		}
	}
	if err := tc.nodes[fi].ReadBarrier(ctx); err != nil {
		t.Fatal(err)
	}
	// Reopen the follower (its store is flushed on close) over errorfs.
	if err := tc.nodes[fi].Close(); err != nil {
		t.Fatal(err)
	}
	var on atomic.Bool
	tc.cfgs[fi].StoreFS = errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if on.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsRead && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	f, err := Open(tc.cfgs[fi])
	if err != nil {
		t.Fatal(err)
	}
	tc.nodes[fi] = f
	l = tc.leader()
	on.Store(true)
	if _, err := l.Submit(ctx, kvPut("k01234", `"new"`, nil), 64); err != nil {
		t.Fatalf("the healthy majority refused a write: %v", err)
	}
	herr := waitHalted(t, f, 10*time.Second)
	var ae *state.ApplyError
	if !errors.As(herr, &ae) || ae.Key == nil || !errors.Is(herr, errorfs.ErrInjected) {
		t.Fatalf("the follower stopped with %v, want an ApplyError naming the key", herr)
	}
	checkRefuses(t, f)
	for i := 0; i < 10; i++ {
		if _, err := l.Submit(ctx, kvPut(fmt.Sprintf("more%d", i), `"m"`, nil), 64); err != nil {
			t.Fatalf("write %d with one follower stopped: %v", i, err)
		}
	}

	if err := f.Close(); err != nil {
		t.Logf("close of the stopped node: %v", err)
	}
	on.Store(false)
	tc.cfgs[fi].StoreFS = nil
	if f, err = Open(tc.cfgs[fi]); err != nil {
		t.Fatal(err)
	}
	tc.nodes[fi] = f
	l = tc.leader()
	if err := f.ReadBarrier(ctx); err != nil {
		t.Fatal(err)
	}
	want, err := l.Store().Checksum()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkFor(10*time.Second, func() error {
		got, err := f.Store().Checksum()
		if err != nil || got != want || f.AppliedIndex() != l.AppliedIndex() {
			return fmt.Errorf("checksum %x (err %v) at %d, leader %x at %d", got, err, f.AppliedIndex(), want, l.AppliedIndex())
		}
		return nil
	}); err != nil {
		t.Fatalf("after the restart without the fault: %v", err)
	}
	rd := f.Store().Reader()
	e, ok := rd.KVGet("default", "k01234", time.Now().UnixMicro())
	rd.Close()
	if !ok || string(e.Value) != `"new"` {
		t.Fatalf("the entry the follower stopped at was not applied after the restart: %q %v", e.Value, ok)
	}
}

// checkFor polls f until it returns nil or total has passed.
func checkFor(total time.Duration, f func() error) error {
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
