package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

func randomKey(t *testing.T) string {
	t.Helper()
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// memberIDs lists the members n reports.
func memberIDs(t *testing.T, n node) []string {
	t.Helper()
	v, err := getCluster(n, false)
	if err != nil {
		t.Fatalf("members from %s: %v", n.name(), err)
	}
	var ids []string
	for _, m := range v.Members {
		ids = append(ids, m.ID)
	}
	sort.Strings(ids)
	return ids
}

func pushOne(t *testing.T, n node, queue, txid string) {
	t.Helper()
	err := checkFor(20*time.Second, 50*time.Millisecond, func() error {
		code, b, err := doT("POST", n.base()+"/api/v1/push", map[string]any{"items": []pushItem{{Queue: queue, Partition: "p", TransactionID: txid, Payload: map[string]any{"id": txid}}}}, 5*time.Second)
		if err != nil {
			return err
		}
		if code != 201 {
			return fmt.Errorf("push %s on %s: %d %s", txid, n.name(), code, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestClusterKeyProcesses: three real processes with a cluster key
// replicate and converge; a fourth started with another key asks to join
// (QUEEN_JOIN) and is refused, as is a join of an address nobody listens
// on; the cluster keeps its quorum through a leader kill; the fourth,
// restarted with the right key, joins as a voter and catches up.
func TestClusterKeyProcesses(t *testing.T) {
	key := randomKey(t)
	c := startProcCluster(t, 3, "QUEEN_CLUSTER_KEY="+key)
	nodes := c.nodes()
	leader := waitServing(t, nodes, 30*time.Second)
	via := others(nodes, leader)[0]
	for i := 0; i < 20; i++ {
		pushOne(t, nodes[i%3], "keyed", fmt.Sprintf("m%d", i))
	}
	waitConverged(t, nodes, 30*time.Second)

	addrs := freeAddrs(t, 3)
	n4 := &proc{t: t, id: "n4", httpAddr: addrs[0], raftAddr: addrs[1], dataDir: filepath.Join(t.TempDir(), "data"),
		env: []string{"QUEEN_JOIN=" + via.(*proc).httpAddr, "QUEEN_CLUSTER_KEY=" + randomKey(t)}}
	n4.logPath = filepath.Join(filepath.Dir(n4.dataDir), "queen.log")
	n4.start()
	t.Cleanup(func() {
		if n4.alive() {
			n4.kill()
		}
		if t.Failed() {
			t.Logf("log of n4:\n%s", n4.logTail())
		}
	})
	// The refusal is logged by the joining node at its first attempt.
	if err := checkFor(30*time.Second, 100*time.Millisecond, func() error {
		if l := n4.logTail(); !strings.Contains(l, "join_unreachable") || !strings.Contains(l, "did not prove the cluster key") {
			return fmt.Errorf("n4 has not logged a join refused for its key yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(memberIDs(t, via), ","); got != "n1,n2,n3" {
		t.Fatalf("members after a join with the wrong key: %s", got)
	}
	code, b, err := doT("POST", via.base()+"/api/v1/cluster/join", map[string]any{"id": "n5", "address": addrs[2]}, 30*time.Second)
	if err != nil || code != 503 || !strings.Contains(string(b), "join_unreachable") {
		t.Fatalf("join of an address nobody listens on: %d %s %v", code, b, err)
	}
	if got := strings.Join(memberIDs(t, via), ","); got != "n1,n2,n3" {
		t.Fatalf("members after a join of an unreachable node: %s", got)
	}

	// Two of three voters are a quorum: kill the leader, writes go on.
	c.byName(leader).kill()
	waitServing(t, nodes, 30*time.Second)
	pushOne(t, via, "keyed", "after-kill")

	// n4 with the cluster's key: it joins, as a voter, and catches up.
	n4.kill()
	n4.env = []string{"QUEEN_JOIN=" + via.(*proc).httpAddr, "QUEEN_CLUSTER_KEY=" + key}
	n4.start()
	err = checkFor(60*time.Second, 200*time.Millisecond, func() error {
		v, err := getCluster(via, false)
		if err != nil {
			return err
		}
		for _, m := range v.Members {
			if m.ID == "n4" && m.Reachable && m.Suffrage == "Voter" {
				return nil
			}
		}
		return fmt.Errorf("n4 is not a reachable voter yet: %+v", v.Members)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitConverged(t, append(nodes, n4), 60*time.Second)
}
