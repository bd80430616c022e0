package cluster

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	etcdraft "go.etcd.io/raft/v3"

	"github.com/queen-mq/queen/internal/state"
)

// onLoop runs fn on n's ready loop, which owns n.rn and n.propBuf.
func onLoop(t *testing.T, n *Node, fn func()) {
	t.Helper()
	done := make(chan struct{})
	select {
	case n.funcs <- func(*etcdraft.RawNode) { fn(); close(done) }:
	case <-time.After(10 * time.Second):
		t.Fatal("the ready loop did not take the function")
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the ready loop did not run the function")
	}
}

// logPayloads decodes the pushes' payloads of n's log entries after index
// from, by transaction id, from the entries raft holds in memory and from
// the log file alike.
func logPayloads(t *testing.T, n *Node, from uint64) map[string][]byte {
	t.Helper()
	last, err := n.logs.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	if last <= from {
		return out
	}
	ents, err := n.logs.Entries(from+1, last+1, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	var l walRecord
	for _, e := range ents {
		if err := n.wal.GetLog(e.GetIndex(), &l); err != nil {
			t.Fatalf("%s: read log entry %d: %v", n.ID(), e.GetIndex(), err)
		}
		if !bytes.Equal(l.Data, e.GetData()) {
			t.Fatalf("%s: log entry %d in the file differs from raft's", n.ID(), e.GetIndex())
		}
		if len(e.GetData()) == 0 {
			continue
		}
		_, body := unwrapEntry(e.GetData())
		en, err := state.DecodeEntry(body)
		if err != nil {
			t.Fatalf("%s: decode log entry %d: %v", n.ID(), e.GetIndex(), err)
		}
		for _, c := range en.Cmds {
			if p, ok := c.(*state.Push); ok {
				for _, it := range p.Items {
					out[it.TxID] = it.Payload
				}
			}
		}
	}
	return out
}

// The leader encodes every proposal into one buffer it reuses (raft copies
// the entry as it appends it): entries proposed one after the other, of
// different sizes, must each reach every node's log as proposed. A
// follower's raft forwards the proposal's message to the leader, so a
// proposal made while following must not leave its buffer for the next.
func TestProposalBufferReusedOnlyByTheLeader(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	tc := startClusterWith(t, 3, func(i int, c *Config) {
		c.SnapshotThreshold, c.SnapshotInterval = 1<<30, time.Hour
	})
	ctx := ctxT(t, 60*time.Second)
	l := tc.leader()
	first := l.commit.Load()
	want := map[string][]byte{}
	payload := func() []byte {
		b := make([]byte, 1+rng.IntN(64<<10))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for i := range 40 {
		tx := fmt.Sprintf("tx%03d", i)
		want[tx] = payload()
		cmd := &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: tx, Generated: true, Payload: want[tx]}}}
		if _, err := l.Submit(ctx, cmd, len(want[tx])); err != nil {
			t.Fatalf("push %s: %v", tx, err)
		}
	}
	var kept int
	onLoop(t, l, func() { kept = cap(l.propBuf) })
	if kept == 0 {
		t.Fatal("the leader kept no proposal buffer")
	}

	// A proposal on a follower's loop: raft forwards it to the leader.
	f := tc.follower()
	tx := "from-follower"
	want[tx] = payload()
	p := &proposal{id: newReqID(), cmd: &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: tx, Generated: true, Payload: want[tx]}}}, done: make(chan struct{})}
	var followerBuf int
	onLoop(t, f, func() {
		f.propose([]*proposal{p})
		followerBuf = cap(f.propBuf)
	})
	if followerBuf != 0 {
		t.Fatalf("a follower kept a proposal buffer of %d bytes that its raft forwarded", followerBuf)
	}
	// The leader's next proposals reuse its buffer while the forwarded one
	// is on its way.
	for i := range 10 {
		tx := fmt.Sprintf("after%02d", i)
		want[tx] = payload()
		cmd := &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: tx, Generated: true, Payload: want[tx]}}}
		if _, err := l.Submit(ctx, cmd, len(want[tx])); err != nil {
			t.Fatalf("push %s: %v", tx, err)
		}
	}
	for _, n := range tc.nodes {
		if err := checkFor(20*time.Second, func() error {
			got := logPayloads(t, n, first)
			if len(got) < len(want) {
				return fmt.Errorf("%s: %d of %d pushes in the log", n.ID(), len(got), len(want))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		got := logPayloads(t, n, first)
		for tx, w := range want {
			if !bytes.Equal(got[tx], w) {
				t.Fatalf("%s: push %s has %d bytes in the log, want the %d proposed", n.ID(), tx, len(got[tx]), len(w))
			}
		}
	}
}
