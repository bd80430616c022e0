package cluster

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func waitLeads(t *testing.T, n *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !n.IsLeader() {
		if ctx.Err() != nil {
			t.Fatalf("%s does not lead", n.ID())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A node restarted on other addresses than its stored cluster has refuses
// to start, naming the addresses and the fix; on its own addresses it
// starts again.
func TestStartRefusesMovedMembers(t *testing.T) {
	t.Run("own address", func(t *testing.T) {
		tc := startCluster(t, 3)
		for i, n := range tc.nodes {
			n.Close()
			tc.nodes[i] = nil
		}
		cfg := tc.cfgs[0]
		moved := cfg
		moved.RaftAddr = freeAddr(t)
		if n, err := Open(moved); err == nil {
			n.Close()
			t.Fatalf("started on %s though the stored cluster has n1 at %s", moved.RaftAddr, cfg.RaftAddr)
		} else {
			for _, want := range []string{"n1 is configured at " + moved.RaftAddr + " but stored at " + cfg.RaftAddr, "QUEEN_RAFT_ADDR", "-base-port", "remove " + cfg.DataDir} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q: %v", want, err)
				}
			}
		}
		n, err := Open(cfg)
		if err != nil {
			t.Fatalf("reopen on the stored address after the refusal: %v", err)
		}
		n.Close()
	})
	t.Run("single voter moves", func(t *testing.T) {
		cfg := Config{DataDir: filepath.Join(t.TempDir(), "n1"), NodeID: "n1", RaftAddr: freeAddr(t), Logger: quietLogger()}
		n, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		waitLeads(t, n)
		n.Close()
		cfg.RaftAddr = freeAddr(t)
		if n, err = Open(cfg); err != nil {
			t.Fatalf("a single voter on a new address: %v", err)
		}
		waitLeads(t, n)
		n.Close()
	})
	t.Run("peers", func(t *testing.T) {
		tc := startCluster(t, 3)
		for i, n := range tc.nodes {
			n.Close()
			tc.nodes[i] = nil
		}
		// n1 keeps its address; QUEEN_PEERS names n2 and n3 elsewhere.
		cfg := tc.cfgs[0]
		cfg.Peers = append([]Peer(nil), cfg.Peers...)
		cfg.Peers[1].Address, cfg.Peers[2].Address = freeAddr(t), freeAddr(t)
		n, err := Open(cfg)
		if err == nil {
			n.Close()
			t.Fatal("n1 started with QUEEN_PEERS that move n2 and n3")
		}
		if !strings.Contains(err.Error(), "n2 is configured at "+cfg.Peers[1].Address+" but stored at "+tc.cfgs[1].RaftAddr) ||
			!strings.Contains(err.Error(), "n3 is configured at") {
			t.Errorf("error does not name both moved members: %v", err)
		}
		// Peers the stored cluster does not have (or lacks) are no mismatch.
		cfg = tc.cfgs[0]
		cfg.Peers = cfg.Peers[:1]
		n, err = Open(cfg)
		if err != nil {
			t.Fatalf("n1 with a shorter QUEEN_PEERS: %v", err)
		}
		n.Close()
	})
}
