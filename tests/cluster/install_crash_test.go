package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// installPoints are the failpoints of a snapshot install, in order
// (internal/cluster/install.go).
var installPoints = []string{"install-start", "install-unpacked", "install-old-moved", "install-swapped", "install-opened"}

// TestSnapshotInstallCrash kills a follower (SIGKILL from inside, through
// QUEEN_FAILPOINTS) at each step of installing a snapshot from the leader:
// with the snapshot received but not installed, with the new state
// unpacked, with the old state moved away and the new one not yet in place
// (an empty store, before the fix), with both in place, and with the new
// store open. After each crash the node restarts without the failpoint
// and must end with the leader's applied index and state checksum, and
// serve everything written. (Here the leader often sends the snapshot
// again, which also repairs the node; TestOpenRepairsInterruptedInstall in
// internal/cluster opens each crash's directory with no leader to lean on.)
func TestSnapshotInstallCrash(t *testing.T) {
	base := []string{"QUEEN_SNAPSHOT_THRESHOLD=64", "QUEEN_SNAPSHOT_TRAILING_LOGS=32", "QUEEN_SNAPSHOT_INTERVAL=50ms", "QUEEN_RAFT_SEGMENT_BYTES=65536"}
	c := startProcCluster(t, 3, base...)
	all := c.nodes()
	n3 := c.procs[2]
	rest := others(all, n3)
	env := append([]string(nil), n3.env...) // with QUEEN_PEERS
	kv := map[string]string{}
	pushed := load(t, all, "a", 100, kv)
	for round, fp := range installPoints {
		n3.kill()
		waitServing(t, rest, 30*time.Second)
		// Move the log on until the leader has dropped the entries n3
		// lacks, so that it must be sent a snapshot.
		pushed += load(t, rest, fmt.Sprintf("r%d", round), 600, kv)
		n3.env = append(append([]string(nil), env...), "QUEEN_FAILPOINTS="+fp+"=kill")
		n3.start()
		// It dies at the failpoint once it is sent a snapshot. No load
		// meanwhile when it can be helped: after the crash, the leader
		// must still hold the entries after that snapshot, so that the
		// restarted node is sent those entries, not a newer snapshot.
		for i := 0; ; i++ {
			if checkFor(5*time.Second, 50*time.Millisecond, func() error {
				if n3.alive() {
					return fmt.Errorf("alive")
				}
				return nil
			}) == nil {
				break
			}
			if i == 8 {
				t.Fatalf("round %d: %s never reached failpoint %s (caught up from the log?)\n%s", round, n3.id, fp, n3.logTail())
			}
			pushed += load(t, rest, fmt.Sprintf("r%d-%d", round, i), 300, kv)
		}
		if !strings.Contains(n3.logTail(), "failpoint "+fp+": kill") {
			t.Fatalf("round %d: %s died, but not at failpoint %s:\n%s", round, n3.id, fp, n3.logTail())
		}
		n3.env = env
		n3.start()
		waitServing(t, all, 60*time.Second)
		sum := waitConverged(t, all, 60*time.Second)
		t.Logf("killed at %s, restarted: checksum %s on every node", fp, sum)
	}
	checkServes(t, n3, kv, pushed)
}
