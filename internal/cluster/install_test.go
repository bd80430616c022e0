package cluster

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// installCfg is a single node that snapshots only when told to.
func installCfg(t *testing.T) Config {
	return Config{DataDir: filepath.Join(t.TempDir(), "n1"), NodeID: "n1", RaftAddr: freeAddr(t),
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger(),
		TrailingLogs: 2, SnapshotThreshold: 1 << 30, SnapshotInterval: time.Hour, WALSegmentSize: 64 << 10}
}

func openLeader(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	(&testCluster{t: t, nodes: []*Node{n}}).leader()
	return n
}

func putKeys(t *testing.T, n *Node, tag string, count int) {
	t.Helper()
	for i := 0; i < count; i++ {
		if _, err := n.Submit(ctxT(t, 10*time.Second), kvPut(fmt.Sprintf("%s%d", tag, i), fmt.Sprintf(`"%s"`, tag), nil), 64); err != nil {
			t.Fatal(err)
		}
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		in, err := os.Open(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(to, e.Name()))
		if err == nil {
			_, err = io.Copy(out, in)
			out.Close()
		}
		in.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestOpenRepairsInterruptedInstall lays out a data directory as a crash
// in the middle of a snapshot install leaves it, and checks that the node
// opens to exactly the state it had: a store older than the node's newest
// snapshot (the crash came after the snapshot was in place, before the new
// state was), and a swap cut between moving the old state away and putting
// the new one in (no state directory: Pebble would open empty). Before the
// fix, raft applied the entries after the snapshot onto the old or empty
// store, and the checksum differed.
func TestOpenRepairsInterruptedInstall(t *testing.T) {
	for _, c := range []struct {
		name  string
		crash func(t *testing.T, dataDir, early string)
	}{
		{"store behind the snapshot", func(t *testing.T, dataDir, early string) {
			st := filepath.Join(dataDir, stateDirName)
			if err := os.RemoveAll(st); err != nil {
				t.Fatal(err)
			}
			copyDir(t, early, st)
		}},
		{"old state moved away, new not in place", func(t *testing.T, dataDir, early string) {
			st := filepath.Join(dataDir, stateDirName)
			if err := os.Rename(st, st+oldSuffix); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(dataDir, restoreDirName), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dataDir, restoreDirName, "000001.sst"), []byte("half"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"new state in place, old still there", func(t *testing.T, dataDir, early string) {
			copyDir(t, early, filepath.Join(dataDir, stateDirName+oldSuffix))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := installCfg(t)
			n := openLeader(t, cfg)
			putKeys(t, n, "a", 50)
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			early := filepath.Join(t.TempDir(), "early")
			copyDir(t, filepath.Join(cfg.DataDir, stateDirName), early)

			n = openLeader(t, cfg)
			putKeys(t, n, "b", 50)
			if err := n.snapshotNow(); err != nil {
				t.Fatal(err)
			}
			putKeys(t, n, "c", 20)
			want, err := n.Store().Checksum()
			if err != nil {
				t.Fatal(err)
			}
			wantApplied := n.AppliedIndex()
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}

			c.crash(t, cfg.DataDir, early)

			n = openLeader(t, cfg)
			defer n.Close()
			if err := n.ReadBarrier(ctxT(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			got, err := n.Store().Checksum()
			if err != nil {
				t.Fatal(err)
			}
			// The restarted leader's first entry (raft's empty entry of its
			// term) is the only one past the state before the crash.
			if got != want || n.AppliedIndex() != wantApplied+1 {
				t.Fatalf("after the crash and a restart: checksum %x at %d, want %x at %d (%d, and the new term's empty entry)", got, n.AppliedIndex(), want, wantApplied+1, wantApplied)
			}
			for _, leftover := range []string{stateDirName + oldSuffix, restoreDirName} {
				if _, err := os.Stat(filepath.Join(cfg.DataDir, leftover)); !os.IsNotExist(err) {
					t.Errorf("%s is still there after the restart (%v)", leftover, err)
				}
			}
		})
	}
}

// TestRestartSnapshotsWhileReplaying: a node restarted with a state far
// past its newest snapshot takes a snapshot while raft is still handing it
// the log from the log's start; the log must not be compacted past what
// raft has handed over (raft stops the process when it cannot read the
// entries it is about to hand over).
func TestRestartSnapshotsWhileReplaying(t *testing.T) {
	cfg := installCfg(t)
	cfg.SnapshotThreshold, cfg.SnapshotInterval, cfg.TrailingLogs = 1<<30, time.Hour, 2
	n := openLeader(t, cfg)
	putKeys(t, n, "a", 200)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.SnapshotThreshold, cfg.SnapshotInterval = 10, time.Millisecond
	n = openLeader(t, cfg)
	defer n.Close()
	putKeys(t, n, "b", 20)
	if err := checkFor(10*time.Second, func() error {
		if n.logs.snapshotIndex() < 200 {
			return fmt.Errorf("snapshot index %d", n.logs.snapshotIndex())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := n.ReadBarrier(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}
