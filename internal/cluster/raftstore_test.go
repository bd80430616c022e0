package cluster

import (
	"fmt"
	"math"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/queen-mq/queen/internal/state"
)

// recentRange is the first and last index of the log's in-memory tail and
// its length (0, 0, 0 when empty).
func (s *logStore) recentRange() (first, last uint64, n int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.recent) == 0 {
		return 0, 0, 0
	}
	return s.recent[0].GetIndex(), s.recent[len(s.recent)-1].GetIndex(), len(s.recent)
}

// An entry leaves the in-memory tail only once it is both applied and held
// by every replicating follower; the size bounds still apply before that.
func TestLogTailReleasesWhatNoOneReads(t *testing.T) {
	s := &logStore{}
	for i := uint64(1); i <= 10; i++ {
		s.recent = append(s.recent, &pb.Entry{Index: new(i), Term: new(uint64(1)), Data: make([]byte, 100)})
		s.recentSz += 100
	}
	s.last = 10
	check := func(step string, wantFirst uint64, wantN int) {
		t.Helper()
		first, _, n := s.recentRange()
		if first != wantFirst || n != wantN || s.recentSz != 100*wantN {
			t.Fatalf("%s: tail starts at %d with %d entries (%d bytes), want %d with %d", step, first, n, s.recentSz, wantFirst, wantN)
		}
	}
	s.releaseReplicated(6)
	check("replicated through 6, nothing applied", 1, 10)
	s.releaseApplied(4)
	check("applied through 4", 5, 6)
	s.releaseApplied(8)
	check("applied through 8, replicated through 6", 7, 4)
	s.releaseApplied(7) // an older index changes nothing
	check("applied through 7 again", 7, 4)
	s.releaseReplicated(math.MaxUint64)
	check("no follower to send to", 9, 2)
	s.releaseApplied(10)
	check("all applied", 0, 0)
}

// After a burst of writes, no node keeps the entries it applied and its
// followers hold in memory, and a follower that was away catches up from
// the log file.
func TestLogTailEmptiesOnceAppliedAndReplicated(t *testing.T) {
	tc := startCluster(t, 3)
	l := tc.leader()
	ctx := ctxT(t, 60*time.Second)
	push := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			v, err := l.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: fmt.Sprintf("t%d", i), Payload: []byte(`1`)}}}, 64)
			if err != nil {
				t.Fatalf("push %d: %v", i, err)
			}
			if r, ok := v.(*state.PushResult); !ok || r.Err != nil {
				t.Fatalf("push %d: %T %+v", i, v, v)
			}
		}
	}
	waitTail := func(n *Node, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			first, last, k := n.logs.recentRange()
			if k == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %s keeps %d entries (%d-%d) in memory; applied %d, log ends at %d", what, n.ID(), k, first, last, n.raftApplied.Load(), n.logs.lastIndex())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	push(0, 200)
	for _, n := range tc.nodes {
		waitTail(n, "node")
	}

	// A follower away: the leader does not keep the entries for it.
	var away int
	for i, n := range tc.nodes {
		if n != l {
			away = i
			break
		}
	}
	if err := tc.nodes[away].Close(); err != nil {
		t.Fatal(err)
	}
	tc.nodes[away] = nil
	push(200, 400)
	waitTail(l, "leader with a follower away")

	back, err := Open(tc.cfgs[away])
	if err != nil {
		t.Fatalf("reopen %s: %v", tc.cfgs[away].NodeID, err)
	}
	tc.nodes[away] = back
	deadline := time.Now().Add(20 * time.Second)
	for back.AppliedIndex() < l.AppliedIndex() {
		if time.Now().After(deadline) {
			t.Fatalf("follower back applied %d, leader %d", back.AppliedIndex(), l.AppliedIndex())
		}
		time.Sleep(10 * time.Millisecond)
	}
	rd := back.Store().Reader()
	defer rd.Close()
	if qi, ok := rd.Queue("default", "q"); !ok || qi.Total != 400 {
		t.Fatalf("follower back holds queue q %v with %d messages, want 400", ok, qi.Total)
	}
}
