package cluster

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// TestLeasesSurviveKill9: under QUEEN_FSYNC=always a pop's lease is
// written to the OS but not fsynced before the reply (with a sync interval
// far longer than the test, none is synced by the syncer either). kill -9
// of the leader, and then of every node, loses no lease: the partition is
// not leased again to the group before the lease expires, and an ack under
// the lease succeeds after the restarts; the nodes converge.
func TestLeasesSurviveKill9(t *testing.T) {
	c := startProcCluster(t, 3, "QUEEN_FSYNC=always", "QUEEN_FSYNC_INTERVAL_MS=10000")
	nodes := c.nodes()
	leader := waitServing(t, nodes, 20*time.Second)
	var items []pushItem
	for i := 0; i < 4; i++ {
		items = append(items, pushItem{Queue: "leasekill", Partition: "p", TransactionID: fmt.Sprintf("lk-%d", i), Payload: map[string]any{"i": i}})
	}
	if code, b, err := doT("POST", leader.base()+"/api/v1/push", map[string]any{"items": items}, 10*time.Second); err != nil || code != 201 {
		t.Fatalf("push: %d %s %v", code, b, err)
	}
	pop := func(n node, group string) (int, popReply) {
		t.Helper()
		code, b, err := doT("GET", n.base()+"/api/v1/pop/queue/leasekill?consumerGroup="+group+"&subscriptionMode=all&batch=2&leaseSeconds=120", nil, 10*time.Second)
		if err != nil || (code != 200 && code != 204) {
			t.Fatalf("pop on %s: %d %s %v", n.name(), code, b, err)
		}
		var r popReply
		if code == 200 {
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("pop reply %s: %v", b, err)
			}
		}
		return code, r
	}
	code, leased := pop(leader, "g")
	if code != 200 || len(leased.Messages) != 2 || leased.LeaseID == "" {
		t.Fatalf("first pop: %d %+v", code, leased)
	}
	stillLeased := func(when string) {
		t.Helper()
		n := waitServing(t, nodes, 30*time.Second)
		if code, r := pop(n, "g"); code != 204 {
			t.Fatalf("%s: the group's partition was leased again before its lease expired: %d %+v", when, code, r)
		}
		// The messages are there: another group gets them.
		if code, r := pop(n, fmt.Sprintf("other-%d", time.Now().UnixNano())); code != 200 || len(r.Messages) != 2 {
			t.Fatalf("%s: another group's pop: %d %+v", when, code, r)
		}
	}

	c.byName(leader).kill()
	waitServing(t, others(nodes, leader), 30*time.Second)
	stillLeased("after kill -9 of the leader " + leader.name())

	for _, p := range c.procs {
		if p.alive() {
			p.kill()
		}
	}
	for _, p := range c.procs {
		p.start()
	}
	stillLeased("after kill -9 of every node")

	var acks []map[string]any
	for _, m := range leased.Messages {
		acks = append(acks, map[string]any{"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": leased.LeaseID, "status": "completed"})
	}
	n := waitServing(t, nodes, 30*time.Second)
	code, b, err := doT("POST", n.base()+"/api/v1/ack/batch", map[string]any{"consumerGroup": "g", "acknowledgments": acks}, 10*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("ack: %d %s %v", code, b, err)
	}
	var ar []struct {
		TransactionID string `json:"transactionId"`
		Success       bool   `json:"success"`
		Error         string `json:"error"`
	}
	if err := json.Unmarshal(b, &ar); err != nil || len(ar) != 2 {
		t.Fatalf("ack reply %s: %v", b, err)
	}
	for _, a := range ar {
		if !a.Success {
			t.Fatalf("ack under the lease after kill -9 of every node: %+v; want success (the lease is known)", a)
		}
	}
	// The lease is released by the acks: the group gets the rest.
	if code, r := pop(n, "g"); code != 200 || len(r.Messages) != 2 || r.Messages[0].TransactionID != "lk-2" {
		t.Fatalf("pop after the acks: %d %+v", code, r)
	}
	waitConverged(t, nodes, 30*time.Second)
}
