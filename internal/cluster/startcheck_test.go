package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	raftwal "github.com/hashicorp/raft-wal"
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

// TestOpenRefusesHashicorpDataDir: a data directory whose raft log was
// written by hashicorp/raft (its term key, its records) is refused at open
// with an error naming the fix, before anything in it is changed.
func TestOpenRefusesHashicorpDataDir(t *testing.T) {
	for _, c := range []struct {
		name  string
		write func(t *testing.T, w *raftwal.WAL)
	}{
		{"term key", func(t *testing.T, w *raftwal.WAL) {
			if err := w.SetUint64([]byte("CurrentTerm"), 3); err != nil {
				t.Fatal(err)
			}
		}},
		{"log records", func(t *testing.T, w *raftwal.WAL) {
			if err := w.StoreLogs([]*walRecord{{Index: 1, Term: 1, Type: walCommand, Data: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			walDir := filepath.Join(dir, "raft")
			if err := os.MkdirAll(walDir, 0o755); err != nil {
				t.Fatal(err)
			}
			w, err := raftwal.Open(walDir)
			if err != nil {
				t.Fatal(err)
			}
			c.write(t, w)
			w.Close()
			n, err := Open(Config{DataDir: dir, NodeID: "n1", RaftAddr: freeAddr(t), Logger: quietLogger()})
			if err == nil {
				n.Close()
				t.Fatal("a data directory of hashicorp/raft's log opened")
			}
			if !errors.Is(err, ErrOldDataDir) || !strings.Contains(err.Error(), "docs/operations.md") || !strings.Contains(err.Error(), dir) {
				t.Fatalf("open: %v; want ErrOldDataDir naming the directory and the fix", err)
			}
			w, err = raftwal.Open(walDir)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if f, _ := w.Get(keyFormat); len(f) != 0 {
				t.Fatalf("the refused directory was marked with the new format %q", f)
			}
		})
	}
}
