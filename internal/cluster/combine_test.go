package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/queen-mq/queen/internal/state"
)

// oneNode opens a single-member cluster under mode, leading.
func oneNode(t *testing.T, mode FsyncMode) *Node {
	t.Helper()
	cfg := Config{DataDir: filepath.Join(t.TempDir(), "n1"), NodeID: "n1", RaftAddr: freeAddr(t),
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger(),
		Fsync: mode}
	cfg.Peers = []Peer{{ID: "n1", Address: cfg.RaftAddr}}
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	tc := &testCluster{t: t, cfgs: []Config{cfg}, nodes: []*Node{n}}
	tc.leader()
	return n
}

// pushAll has workers submit count one-message pushes with distinct
// transaction ids to one partition, and checks that each was applied
// exactly once: their offsets are distinct and without gaps, and a push
// after them gets the next offset.
func pushAll(t *testing.T, n *Node, workers, count int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var next atomic.Int64
	var mu sync.Mutex
	offsets := map[uint64]string{}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(count) {
					return
				}
				id := fmt.Sprintf("t%d", i)
				v, err := n.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: id, Payload: []byte(`1`)}}}, 64)
				if err != nil {
					t.Errorf("push %s: %v", id, err)
					return
				}
				r, ok := v.(*state.PushResult)
				if !ok || r.Err != nil || len(r.Items) != 1 {
					t.Errorf("push %s: result %#v", id, v)
					return
				}
				mu.Lock()
				if prev, dup := offsets[r.Items[0].Offset]; dup {
					t.Errorf("offset %d given to %s and %s", r.Items[0].Offset, prev, id)
				}
				offsets[r.Items[0].Offset] = id
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	lo, hi := ^uint64(0), uint64(0)
	for o := range offsets {
		lo, hi = min(lo, o), max(hi, o)
	}
	if len(offsets) != count || hi-lo+1 != uint64(count) {
		t.Fatalf("%d pushes got %d offsets in [%d, %d]", count, len(offsets), lo, hi)
	}
	last := submitOK[*state.PushResult](t, ctx, n, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: "last", Payload: []byte(`1`)}}})
	if got := last.Items[0].Offset; got != hi+1 {
		t.Fatalf("a push after them got offset %d, want %d (one was applied twice?)", got, hi+1)
	}
}

// TestCombineWithLoop: concurrent submitters on a single member, under
// both fsync policies, with combined rounds and the ready loop's rounds
// both proposing; every push is applied once and answered.
func TestCombineWithLoop(t *testing.T) {
	for _, mode := range []FsyncMode{FsyncInterval, FsyncAlways} {
		t.Run(string(mode), func(t *testing.T) {
			n := oneNode(t, mode)
			// Now and then a combined round holds the loop a while, so
			// that submitters meanwhile queue for the ready loop.
			var rounds atomic.Int64
			combineHook = func(*Node) {
				if rounds.Add(1)%20 == 0 {
					time.Sleep(2 * time.Millisecond)
				}
			}
			t.Cleanup(func() { combineHook = nil })
			c0, l0 := n.combines.Load(), n.loopProposals.Load()
			pushAll(t, n, 16, 2000)
			combineHook = nil
			c, l := n.combines.Load()-c0, n.loopProposals.Load()-l0
			t.Logf("%s: %d combined rounds, %d loop rounds that proposed", mode, c, l)
			// Under always a combiner holding the loop proposes what queued
			// meanwhile in its next rounds, so the loop may propose nothing.
			if c == 0 || (mode == FsyncInterval && l == 0) {
				t.Fatalf("want both paths used: %d combined rounds, %d loop rounds that proposed", c, l)
			}
		})
	}
}

// TestCombineLeaderChange: the single member loses leadership in the
// middle of combined rounds (a heartbeat of a higher term from a node
// that is not a member, stepped while the round holds the loop), and is
// elected again. The proposals in flight fail as "may have been applied"
// and are retried with their ids: every push is applied exactly once.
func TestCombineLeaderChange(t *testing.T) {
	for _, mode := range []FsyncMode{FsyncInterval, FsyncAlways} {
		t.Run(string(mode), func(t *testing.T) {
			n := oneNode(t, mode)
			var rounds, changes atomic.Int64
			combineHook = func(n *Node) {
				if rounds.Add(1)%50 != 0 || n.rstate.Load() != int32(etcdraft.StateLeader) {
					return
				}
				changes.Add(1)
				term := n.rn.BasicStatus().GetTerm()
				m := &pb.Message{Type: new(pb.MsgHeartbeat), From: new(uint64(99)), To: new(n.rid), Term: new(term + 1)}
				if err := n.rn.Step(m); err != nil {
					t.Errorf("step a heartbeat of term %d: %v", term+1, err)
				}
			}
			t.Cleanup(func() { combineHook = nil })
			term0 := n.term.Load()
			pushAll(t, n, 4, 1500)
			combineHook = nil
			t.Logf("%s: %d leader changes in combined rounds, term %d -> %d", mode, changes.Load(), term0, n.term.Load())
			if changes.Load() == 0 || n.term.Load() <= term0 {
				t.Fatalf("no leader change happened in a combined round (%d changes, term %d -> %d)", changes.Load(), term0, n.term.Load())
			}
		})
	}
}
