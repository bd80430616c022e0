package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/cluster"
)

// load runs count operations over the live nodes, round robin: pushes,
// pops with acks, and KV puts. It notes the KV values written last in kv
// and returns how many messages it pushed.
func load(t *testing.T, nodes []node, tag string, count int, kv map[string]string) int {
	t.Helper()
	live := []node{}
	for _, n := range nodes {
		if n.alive() {
			live = append(live, n)
		}
	}
	pushed := 0
	for i := 0; i < count; i++ {
		n := live[i%len(live)]
		var code int
		var b []byte
		var err error
		switch i % 4 {
		case 0, 1:
			id := fmt.Sprintf("%s-%d", tag, i)
			code, b, err = doT("POST", n.base()+"/api/v1/push", map[string]any{"items": []pushItem{{Queue: "snap", Partition: fmt.Sprintf("p%d", i%5), TransactionID: id, Payload: map[string]any{"i": i}}}}, 10*time.Second)
			if err == nil && code != 201 {
				err = fmt.Errorf("push: %d %s", code, b)
			}
			pushed++
		case 2:
			code, b, err = doT("GET", n.base()+"/api/v1/pop/queue/snap?consumerGroup=workers&subscriptionMode=all&batch=2&leaseSeconds=30", nil, 10*time.Second)
			if err == nil && code == 200 {
				var r popReply
				json.Unmarshal(b, &r)
				var acks []map[string]any
				for _, m := range r.Messages {
					acks = append(acks, map[string]any{"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": m.LeaseID, "status": "completed"})
				}
				code, b, err = doT("POST", n.base()+"/api/v1/ack/batch", map[string]any{"consumerGroup": "workers", "acknowledgments": acks}, 10*time.Second)
				if err == nil && code != 200 {
					err = fmt.Errorf("ack: %d %s", code, b)
				}
			} else if err == nil && code != 204 {
				err = fmt.Errorf("pop: %d %s", code, b)
			}
		case 3:
			key := fmt.Sprintf("k%d", i%7)
			val := fmt.Sprintf(`"%s-%d"`, tag, i)
			code, b, err = doT("PUT", n.base()+"/api/v1/kv/"+key, map[string]any{"value": json.RawMessage(val)}, 10*time.Second)
			if err == nil && code != 200 {
				err = fmt.Errorf("kv put: %d %s", code, b)
			}
			if err == nil {
				kv[key] = val
			}
		}
		if err != nil {
			t.Fatalf("load op %d on %s: %v", i, n.name(), err)
		}
	}
	return pushed
}

func status(t *testing.T, n *inproc) cluster.NodeStatus {
	return n.b.Node().LocalStatus(false)
}

// waitTruncated waits until the leader's log no longer holds the entry
// after index, so a node at index must be sent a snapshot.
func waitTruncated(t *testing.T, nodes []*inproc, index uint64, trailing uint64) {
	t.Helper()
	err := checkFor(20*time.Second, 20*time.Millisecond, func() error {
		for _, n := range nodes {
			if n.alive() && n.b.Node().IsLeader() {
				st := status(t, n)
				if st.SnapshotIndex > index+trailing+1 {
					return nil
				}
				return fmt.Errorf("leader snapshot at %d, want past %d", st.SnapshotIndex, index+trailing+1)
			}
		}
		return fmt.Errorf("no leader")
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkServes reads through n what was written: KV values, and every
// message of queue "snap" for a new group.
func checkServes(t *testing.T, n node, kv map[string]string, pushed int) {
	t.Helper()
	for key, want := range kv {
		code, b, err := doT("GET", n.base()+"/api/v1/kv/"+key, nil, 10*time.Second)
		if err != nil || code != 200 {
			t.Fatalf("kv get %s on %s: %d %s %v", key, n.name(), code, b, err)
		}
		var r kvGetReply
		json.Unmarshal(b, &r)
		if string(r.Value) != want {
			t.Errorf("kv %s on %s = %s, want %s", key, n.name(), r.Value, want)
		}
	}
	group := fmt.Sprintf("check-%d", time.Now().UnixNano())
	got := drain(t, []node{n}, "snap", group, "all", 20*time.Second, func(seen []message) bool { return len(seen) >= pushed })
	if len(got) != pushed {
		t.Errorf("%s serves %d messages of queue snap, want %d", n.name(), len(got), pushed)
	}
}

// TestSnapshotCatchUp: a node that was down while the log moved past it,
// and then a wiped node re-joining with a new id (QUEEN_JOIN), both catch
// up from a snapshot and end with the same state checksum as the others.
func TestSnapshotCatchUp(t *testing.T) {
	const trailing = 32
	nodes := startInprocCluster(t, 3, nil, func(c *cluster.Config) {
		c.SnapshotThreshold = 64
		c.TrailingLogs = trailing
		c.SnapshotInterval = 50 * time.Millisecond
		c.WALSegmentSize = 32 << 10
	})
	all := asNodes(nodes)
	kv := map[string]string{}
	pushed := 0
	run := func(tag string, count int) {
		pushed += load(t, all, tag, count, kv)
	}
	run("a", 200)

	// Down while the log moves on.
	n3 := nodes[2]
	n3.close()
	downAt := status(t, nodes[0]).CommitIndex
	run("b", 400)
	waitTruncated(t, nodes, downAt, trailing)
	n3.open(t)
	waitServing(t, all, 30*time.Second)
	sum := waitConverged(t, all, 30*time.Second)
	if r := status(t, n3).SnapshotRestores; r < 1 {
		t.Errorf("n3 caught up without installing a snapshot (restores %d)", r)
	}
	checkServes(t, n3, kv, pushed)
	t.Logf("n3 restarted after the log moved on: caught up by snapshot, checksum %s", sum)

	// Wiped, and back under a new id through QUEEN_JOIN.
	n3.close()
	if err := os.RemoveAll(n3.cfg.Cluster.DataDir); err != nil {
		t.Fatal(err)
	}
	run("c", 200)
	waitTruncated(t, nodes, 0, trailing)
	n3.id = "n3-new"
	n3.cfg.Cluster.NodeID = "n3-new"
	n3.cfg.Cluster.Peers = nil
	n3.cfg.Cluster.JoinURL = nodes[0].httpAddr
	n3.open(t)
	waitServing(t, all, 30*time.Second)
	v, err := getCluster(nodes[1], false)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range v.Members {
		ids = append(ids, m.ID)
	}
	sort.Strings(ids)
	if fmt.Sprint(ids) != "[n1 n2 n3-new]" {
		t.Errorf("members after the re-join: %v, want [n1 n2 n3-new] (the old n3 replaced)", ids)
	}
	run("d", 40)
	sum = waitConverged(t, all, 30*time.Second)
	if r := status(t, n3).SnapshotRestores; r < 1 {
		t.Errorf("the wiped node caught up without installing a snapshot (restores %d)", r)
	}
	checkServes(t, n3, kv, pushed)
	t.Logf("wiped node re-joined as n3-new: caught up by snapshot, checksum %s", sum)
}
