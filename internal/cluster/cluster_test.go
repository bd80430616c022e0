package cluster

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
	"github.com/queen-mq/queen/internal/testkit"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	ids := []reqID{newReqID(), newReqID(), newReqID()}
	entry := []byte{1, 2, 3, 4}
	got, rest := unwrapEntry(wrapEntry(ids, entry))
	if len(got) != 3 || got[0] != ids[0] || got[2] != ids[2] || !bytes.Equal(rest, entry) {
		t.Fatalf("unwrap(wrap) = %v %v", got, rest)
	}
	// Entries without an envelope (and malformed ones) pass through whole.
	for _, data := range [][]byte{{1, 9, 9}, {envelopeMagic}, {envelopeMagic, 5, 1, 2}, {envelopeMagic, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}} {
		ids, rest := unwrapEntry(data)
		if ids != nil || !bytes.Equal(rest, data) {
			t.Errorf("unwrap(%v) = %v, %v; want the data whole", data, ids, rest)
		}
	}
}

func TestResultsSurviveGob(t *testing.T) {
	cases := []any{
		&state.PushResult{Items: []state.PushItemResult{{TxID: "a", PartitionID: 7, Offset: 3, Queue: "q"}}},
		&state.PopResult{QueueExists: true, LeaseID: "l", Claimed: 1, Messages: []state.Delivered{{PartitionID: 1, Offset: 2, Payload: []byte(`{"x":1}`), Attempt: 1}}},
		&state.AckResult{Items: []state.AckItemResult{{TxID: "a", Success: true, LeaseReleased: true}}},
		&state.ExtendResult{Success: true, ExpiresAt: 99},
		&state.ConfigureResult{Options: state.DefaultQueueOptions(), Namespace: "ns"},
		&state.CountResult{Err: &state.Error{Code: "queue_not_found", Message: "m"}},
		&state.CountResult{},
		&state.TxnResult{FailedOp: -1, Results: []state.TxnOpResult{{Key: "k", Version: 4}}},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		if err := gob.NewEncoder(&buf).Encode(&rpcResponse{Seq: 1, Result: c}); err != nil {
			t.Fatalf("encode %T: %v", c, err)
		}
		var resp rpcResponse
		if err := gob.NewDecoder(&buf).Decode(&resp); err != nil {
			t.Fatalf("decode %T: %v", c, err)
		}
		if fmt.Sprintf("%T", resp.Result) != fmt.Sprintf("%T", c) {
			t.Fatalf("decoded %T, want %T", resp.Result, c)
		}
		if fmt.Sprintf("%+v", resp.Result) != fmt.Sprintf("%+v", c) {
			t.Errorf("%T: got %+v, want %+v", c, resp.Result, c)
		}
	}
}

func TestSafeToRepeat(t *testing.T) {
	one := uint64(1)
	for _, c := range []struct {
		cmd  state.Command
		want bool
	}{
		{&state.Push{}, true},
		{&state.Tick{}, true},
		{&state.Txn{Ops: []state.TxnOp{{Type: state.OpPush}}}, true},
		{&state.Txn{RequiredLeases: []string{"l"}, Ops: []state.TxnOp{{Type: state.OpPush}}}, false},
		{&state.Txn{Ops: []state.TxnOp{{Type: state.OpPush}, {Type: state.OpKVPut, IfVersion: &one}}}, false},
		{&state.Ack{}, false},
		{&state.Pop{}, false},
	} {
		if got := safeToRepeat(c.cmd); got != c.want {
			t.Errorf("safeToRepeat(%T %+v) = %v", c.cmd, c.cmd, got)
		}
	}
}

// testCluster runs nodes in this process over real TCP.
type testCluster struct {
	t     testing.TB
	nodes []*Node
	cfgs  []Config
}

func freeAddr(t testing.TB) string { return testkit.FreeAddr(t) }

func quietLogger() *slog.Logger {
	// QUEEN_TEST_LOG=1 shows every node's log, raft's included.
	if os.Getenv("QUEEN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug - 4}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func startCluster(t *testing.T, size int) *testCluster { return startClusterB(t, size) }

func startClusterB(t testing.TB, size int) *testCluster {
	t.Helper()
	tc := &testCluster{t: t}
	var peers []Peer
	for i := 0; i < size; i++ {
		addr := freeAddr(t)
		tc.cfgs = append(tc.cfgs, Config{DataDir: filepath.Join(t.TempDir(), fmt.Sprintf("n%d", i+1)), NodeID: fmt.Sprintf("n%d", i+1), RaftAddr: addr,
			HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger()})
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
			if n != nil {
				n.Close()
			}
		}
	})
	tc.leader()
	return tc
}

// leader waits for a leader that has applied its barrier and for every
// other node to know it.
func (tc *testCluster) leader() *Node {
	tc.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		var l *Node
		for _, n := range tc.nodes {
			if n != nil && n.IsLeader() {
				l = n
			}
		}
		if l != nil {
			all := true
			for _, n := range tc.nodes {
				all = all && (n == nil || n.CanServe())
			}
			if all {
				return l
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	tc.t.Fatal("no leader that every node can reach")
	return nil
}

func (tc *testCluster) follower() *Node {
	for _, n := range tc.nodes {
		if n != nil && !n.IsLeader() {
			return n
		}
	}
	tc.t.Fatal("no follower")
	return nil
}

func kvPut(key, value string, ifVersion *uint64) *state.Txn {
	return &state.Txn{Tenant: "default", Ops: []state.TxnOp{{Type: state.OpKVPut, Key: key, Value: []byte(value), IfVersion: ifVersion}}}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestFollowerForwardsAndReadsItsWrites(t *testing.T) {
	tc := startCluster(t, 3)
	f := tc.follower()
	ctx := ctxT(t, 20*time.Second)
	for i := 0; i < 20; i++ {
		zero := uint64(0)
		v, err := f.Submit(ctx, kvPut(fmt.Sprintf("k%d", i), fmt.Sprintf(`"v%d"`, i), &zero), 64)
		if err != nil {
			t.Fatalf("submit on a follower: %v", err)
		}
		r, ok := v.(*state.TxnResult)
		if !ok || r.Err != nil || len(r.Results) != 1 || r.Results[0].Version == 0 {
			t.Fatalf("forwarded result %T %+v", v, v)
		}
		// A linearizable read on another follower sees it at once.
		for _, n := range tc.nodes {
			if err := n.ReadBarrier(ctx); err != nil {
				t.Fatalf("read barrier on %s: %v", n.ID(), err)
			}
			rd := n.Store().Reader()
			e, ok := rd.KVGet("default", fmt.Sprintf("k%d", i), time.Now().UnixMicro())
			rd.Close()
			if !ok || string(e.Value) != fmt.Sprintf(`"v%d"`, i) {
				t.Fatalf("node %s after its read barrier: key k%d = %q, %v", n.ID(), i, e.Value, ok)
			}
		}
	}
	// A push forwarded from a follower.
	v, err := f.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: "t1", Payload: []byte(`1`)}}}, 64)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := v.(*state.PushResult); !ok || r.Err != nil || len(r.Items) != 1 || r.Items[0].TxID != "t1" {
		t.Fatalf("push result %T %+v", v, v)
	}
}

// A command re-sent with the same request id is applied once, whether the
// original finished or is still in flight; a retry the leader cannot place
// is refused rather than applied twice.
func TestRetryIsAppliedOnce(t *testing.T) {
	tc := startCluster(t, 3)
	l := tc.leader()
	f := tc.follower()
	ctx := ctxT(t, 20*time.Second)
	zero := uint64(0)
	req := &request{id: newReqID(), cmd: kvPut("once", `"a"`, &zero), size: 64, minIndex: f.CommitIndex()}
	v1, _, err := f.forwardSubmit(ctx, l.Address(), req)
	if err != nil {
		t.Fatal(err)
	}
	req.retry = true
	v2, _, err := f.forwardSubmit(ctx, l.Address(), req)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	r1, r2 := v1.(*state.TxnResult), v2.(*state.TxnResult)
	if r2.Err != nil || r1.Results[0].Version != r2.Results[0].Version {
		t.Fatalf("retry answered %+v, original %+v: want the original's result", r2, r1)
	}
	// The same on the leader's own path.
	v3, _, err := l.submitLocal(ctx, req)
	if err != nil || v3.(*state.TxnResult).Results[0].Version != r1.Results[0].Version {
		t.Fatalf("local retry: %+v %v", v3, err)
	}
	// A retry whose original may lie before what the leader remembers.
	l.dedup.mu.Lock()
	l.dedup.coverFrom = l.CommitIndex() + 10
	l.dedup.mu.Unlock()
	_, _, err = l.submitLocal(ctx, &request{id: newReqID(), cmd: kvPut("never", `"b"`, &zero), size: 64, retry: true, minIndex: 1})
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("uncovered KV retry: err %v, want ErrOutcomeUnknown", err)
	}
	// Pushes are still safe to propose again (deduplicated by the state).
	v, _, err := l.submitLocal(ctx, &request{id: newReqID(), cmd: &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: "x", Payload: []byte(`1`)}}}, size: 64, retry: true, minIndex: 1})
	if err != nil || v.(*state.PushResult).Err != nil {
		t.Fatalf("uncovered push retry: %+v %v", v, err)
	}
}

func TestJoinAndRemove(t *testing.T) {
	tc := startCluster(t, 3)
	cfg := Config{DataDir: filepath.Join(t.TempDir(), "n4"), NodeID: "n4", RaftAddr: freeAddr(t), Join: true,
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger()}
	n4, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tc.nodes = append(tc.nodes, n4)
	if n4.CanServe() {
		t.Fatal("a node that has not joined says it can serve")
	}
	ctx := ctxT(t, 20*time.Second)
	zero := uint64(0)
	if _, err := tc.nodes[0].Submit(ctx, kvPut("before", `1`, &zero), 64); err != nil {
		t.Fatal(err)
	}
	// Ask a follower: it forwards to the leader.
	if err := tc.follower().Join(ctx, "n4", cfg.RaftAddr); err != nil {
		t.Fatalf("join: %v", err)
	}
	tc.leader()
	if err := n4.ReadBarrier(ctx); err != nil {
		t.Fatal(err)
	}
	rd := n4.Store().Reader()
	_, ok := rd.KVGet("default", "before", time.Now().UnixMicro())
	rd.Close()
	if !ok {
		t.Fatal("the joined node does not have the data written before it joined")
	}
	st := tc.nodes[1].Cluster(ctx, true)
	if len(st.Members) != 4 {
		t.Fatalf("members %+v", st.Members)
	}
	for _, m := range st.Members {
		if !m.Reachable || m.Status == nil || m.Status.Checksum == "" {
			t.Fatalf("member %+v not reachable", m)
		}
	}
	if err := tc.nodes[0].RemoveMember(ctx, "n4"); err != nil {
		t.Fatalf("remove: %v", err)
	}
	var e *Error
	if err := tc.nodes[0].RemoveMember(ctx, "n4"); !errors.As(err, &e) || e.Code != "member_not_found" {
		t.Fatalf("removing an absent member: %v", err)
	}
	// Every node learns the new configuration from the log.
	for _, n := range tc.nodes[:3] {
		deadline := time.Now().Add(10 * time.Second)
		for len(n.Cluster(ctx, false).Members) != 3 {
			if time.Now().After(deadline) {
				t.Fatalf("%s after remove: %+v", n.ID(), n.Cluster(ctx, false).Members)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// BenchmarkSubmit compares a push submitted on the leader with one
// forwarded from a follower (three nodes on this machine, 64 concurrent
// submitters).
func BenchmarkSubmit(b *testing.B) {
	for _, where := range []string{"leader", "follower"} {
		b.Run(where, func(b *testing.B) {
			tc := startClusterB(b, 3)
			n := tc.leader()
			if where == "follower" {
				n = tc.follower()
			}
			ctx := context.Background()
			var seq atomic.Int64
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := fmt.Sprintf("m%d", seq.Add(1))
					if _, err := n.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "bench", Partition: id[len(id)-1:], TxID: id, Payload: []byte(`{"x":1}`)}}}, 64); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestReadAfterRaftOwnEntries: raft's own entries (the empty entry of a
// new term, configuration changes; here an empty entry committed after the
// leader became ready) hold no command. A linearizable read must still
// answer without waiting for some later write.
func TestReadAfterRaftOwnEntries(t *testing.T) {
	tc := startCluster(t, 1)
	n := tc.leader()
	ctx := ctxT(t, 10*time.Second)
	if err := n.ReadBarrier(ctx); err != nil {
		t.Fatalf("first read: %v", err)
	}
	before := n.CommitIndex()
	if err := n.proposeRaw(nil); err != nil {
		t.Fatalf("empty entry: %v", err)
	}
	if err := checkFor(5*time.Second, func() error {
		if n.CommitIndex() <= before {
			return fmt.Errorf("commit index still %d", n.CommitIndex())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if err := n.ReadBarrier(rctx); err != nil {
		t.Fatalf("read after a barrier entry, with no write since: %v", err)
	}
	t.Logf("read answered after %s", time.Since(start).Round(time.Millisecond))
}
