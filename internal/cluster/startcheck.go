package cluster

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// explainLocked turns the error of opening a data directory that another
// process holds ("resource temporarily unavailable" on its lock file) into
// one that says so and names the fix.
func explainLocked(dataDir string, err error) error {
	if err == nil || !(errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)) {
		return err
	}
	abs, aerr := filepath.Abs(dataDir)
	if aerr != nil {
		abs = dataDir
	}
	return fmt.Errorf("data directory %s is in use: another queen process holds its lock; stop that process, or give this node a directory of its own (QUEEN_DATA_DIR or -data-dir): %w", abs, err)
}

// checkMembers compares the membership stored in the data directory with
// the addresses this node was started with: its own advertised address and
// the ones QUEEN_PEERS gives. A node started on other addresses than its
// cluster was created with would dial members where they no longer are (or
// be dialled where it is not), so it refuses to start and says what to do.
// Members that are stored but not configured, or configured but not stored,
// are fine: membership changes after the bootstrap (see docs/cluster.md).
// So is a cluster of this node alone on a new address.
func checkMembers(servers []server, self string, cfg Config) error {
	stored := map[string]string{}
	for _, s := range servers {
		stored[s.ID] = s.Address
	}
	if len(stored) == 1 && stored[self] != "" && len(cfg.Peers) <= 1 {
		// A single voter dials nobody: it may move freely.
		return nil
	}
	want := []Peer{{ID: self, Address: cfg.Advertise}}
	for _, p := range cfg.Peers {
		if p.ID != self {
			want = append(want, p)
		}
	}
	var bad []string
	for _, p := range want {
		if addr, ok := stored[p.ID]; ok && addr != p.Address {
			bad = append(bad, fmt.Sprintf("%s is configured at %s but stored at %s", p.ID, p.Address, addr))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	var members []string
	for id, addr := range stored {
		members = append(members, id+"="+addr)
	}
	sort.Strings(members)
	return fmt.Errorf("the cluster stored in %s does not match this node's addresses (%s; stored members: %s): start the node with the addresses the cluster has (QUEEN_RAFT_ADDR, QUEEN_RAFT_ADVERTISE, QUEEN_PEERS; for queen dev-cluster, the same -base-port), move a member with a join and a removal (docs/cluster.md), or remove %s to start a new cluster",
		cfg.DataDir, strings.Join(bad, "; "), strings.Join(members, ","), cfg.DataDir)
}
