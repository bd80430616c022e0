package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// Error is a refusal with an API error code, e.g. "last_member".
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func validMember(id, addr string) error {
	if id == "" || len(id) > 128 {
		return &Error{Code: "invalid_parameter", Message: fmt.Sprintf("id must be 1-128 bytes, got %d", len(id))}
	}
	if strings.ContainsAny(id, " \t\r\n,=") {
		return &Error{Code: "invalid_parameter", Message: fmt.Sprintf("id %q must not contain spaces, commas or '='", id)}
	}
	if addr != "" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return &Error{Code: "invalid_parameter", Message: fmt.Sprintf("address %q must be the node's raft host:port: %v", addr, err)}
		}
	}
	return nil
}

// Join adds a voter (through the leader, wherever it is). The new node
// must first answer on its node port, authenticated like every peer and
// under the id given; it then catches up as a non-voter and is promoted
// only once it has the leader's log, so a join never costs the cluster its
// quorum. A node already in the configuration with the same address is
// left as it is; a member with the same address but another id (the same
// machine, wiped and started with a new id) is replaced.
func (n *Node) Join(ctx context.Context, id, addr string) error {
	if err := validMember(id, addr); err != nil {
		return err
	}
	if addr == "" {
		return &Error{Code: "invalid_parameter", Message: "address is required: the joining node's raft host:port"}
	}
	return n.membership(ctx, &rpcRequest{Op: opJoin, MemberID: id, Address: addr}, func(ctx context.Context) error { return n.joinLocal(ctx, id, addr) })
}

// RemoveMember removes a server from the configuration (through the leader).
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	if err := validMember(id, ""); err != nil {
		return err
	}
	return n.membership(ctx, &rpcRequest{Op: opRemove, MemberID: id}, func(context.Context) error { return n.removeLocal(id) })
}

func (n *Node) membership(ctx context.Context, req *rpcRequest, local func(context.Context) error) error {
	bo := newBackoff()
	var lastErr error
	for {
		if n.closed.Load() {
			return ErrShutdown
		}
		var err error
		if n.IsLeader() {
			err = local(ctx)
		} else if addr, id := n.LeaderAddr(); addr != "" && id != n.id {
			var resp *rpcResponse
			req.TimeoutNs = int64(timeoutOf(ctx, 20*time.Second))
			resp, err = n.rpc.call(ctx, addr, req, nil)
			if err == nil {
				switch resp.Code {
				case codeOK:
					// A change takes effect on each node when it applies it:
					// this node's view includes it once it has applied as
					// far as the leader had (the change made, a failed wait
					// is no error).
					_ = n.ReadBarrier(ctx)
				case codeNotLeader:
					err = fmt.Errorf("%w: %s", ErrNotLeader, resp.Msg)
				default:
					return remoteError(resp)
				}
			}
		} else {
			err = errors.New("no leader is known")
		}
		if err == nil {
			return nil
		}
		var e *Error
		if errors.As(err, &e) {
			return err
		}
		lastErr = err
		if !bo.wait(ctx, n.closing) {
			return fmt.Errorf("%w: membership change not confirmed before the deadline (last error: %v)", ErrNotLeader, lastErr)
		}
	}
}

// probe asks the node at addr for its status over the node port.
func (n *Node) probe(ctx context.Context, addr string) (*NodeStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := n.rpc.call(ctx, addr, &rpcRequest{Op: opStatus, TimeoutNs: int64(2 * time.Second)}, nil)
	if err != nil {
		return nil, err
	}
	if resp.Node == nil {
		return nil, fmt.Errorf("no status in its answer: %s", resp.Msg)
	}
	return resp.Node, nil
}

func (n *Node) joinLocal(ctx context.Context, id, addr string) error {
	if !n.IsLeader() {
		return ErrNotLeader
	}
	servers, err := n.configuration()
	if err != nil {
		return err
	}
	nonvoter := false
	for _, s := range servers {
		if s.ID == id && s.Address == addr {
			if s.Suffrage == "Voter" {
				return nil
			}
			nonvoter = true
		}
	}
	st, err := n.probe(ctx, addr)
	if err != nil {
		return &Error{Code: "join_unreachable", Message: fmt.Sprintf("the node at %s does not answer on its node port, so it was not added (%v); start it with QUEEN_RAFT_ADDR (or QUEEN_RAFT_ADVERTISE) %s and the cluster's QUEEN_CLUSTER_KEY or a certificate of its CA, then join again", addr, err, addr)}
	}
	if st.ID != id {
		return &Error{Code: "join_wrong_node", Message: fmt.Sprintf("the node at %s says its id is %q, not %q; join it under its own id", addr, st.ID, id)}
	}
	for _, s := range servers {
		if s.Address == addr && s.ID != id {
			n.log.Info("replacing a member that had the joining node's address", "old", s.ID, "new", id, "address", addr)
			if err := n.changeConf(ctx, pb.ConfChangeRemoveNode, s.ID, ""); err != nil {
				return err
			}
			n.noteReplaced(addr)
		}
	}
	// Let the leader stop replicating to the removed member first (the new
	// node drops messages meant for the old one); the joining node asks
	// again.
	if wait := n.replacedWait(addr); wait > 0 {
		return &Error{Code: "join_pending", Message: fmt.Sprintf("removed the old member at %s; join again in %v, once the leader has stopped replicating to it (a joining node retries by itself)", addr, wait.Round(time.Second))}
	}
	if !nonvoter {
		if err := n.changeConf(ctx, pb.ConfChangeAddLearnerNode, id, addr); err != nil {
			return err
		}
		n.log.Info("added a non-voter; it becomes a voter once it has caught up", "id", id, "address", addr)
	}
	// Promote only once it holds the log up to here: a voter that cannot
	// take entries would count against the quorum.
	target := n.LastIndex()
	wait := timeoutOf(ctx, 15*time.Second) * 3 / 4
	deadline := time.Now().Add(wait)
	var have uint64
	for {
		if st, err := n.probe(ctx, addr); err == nil {
			have = st.LastLogIndex
			if have >= target {
				break
			}
		}
		if time.Now().After(deadline) {
			return &Error{Code: "join_pending", Message: fmt.Sprintf("%s is catching up as a non-voter (at index %d of %d); the leader makes it a voter by itself once it has (GET /api/v1/cluster shows its suffrage)", id, have, target)}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.closing:
			return ErrShutdown
		case <-time.After(50 * time.Millisecond):
		}
		if !n.IsLeader() {
			return ErrNotLeader
		}
	}
	if err := n.changeConf(ctx, pb.ConfChangeAddNode, id, addr); err != nil {
		return err
	}
	n.log.Info("added a voter", "id", id, "address", addr)
	return nil
}

// promoteEvery is how often the leader looks for non-voters to promote.
const promoteEvery = 250 * time.Millisecond

// promoteLoop, on the leader, makes a voter of every non-voter that has
// reached the index the leader's log had one round earlier: a join whose
// request went away (the joining node restarted, the client gave up)
// still ends with a voter, never with a node left out of the quorum.
func (n *Node) promoteLoop() {
	defer n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-n.closing
		cancel()
	}()
	marks := map[string]uint64{}
	t := time.NewTicker(promoteEvery)
	defer t.Stop()
	for {
		select {
		case <-n.closing:
			return
		case <-t.C:
		}
		servers, err := n.configuration()
		if !n.IsLeader() || err != nil {
			clear(marks)
			continue
		}
		seen := map[string]bool{}
		for _, s := range servers {
			if s.Suffrage != "Nonvoter" {
				continue
			}
			seen[s.ID] = true
			mark, ok := marks[s.ID]
			marks[s.ID] = n.LastIndex()
			if !ok {
				continue
			}
			st, err := n.probe(ctx, s.Address)
			if err != nil || st.ID != s.ID || st.LastLogIndex < mark {
				continue
			}
			if err := n.changeConf(ctx, pb.ConfChangeAddNode, s.ID, s.Address); err != nil {
				n.log.Warn("promoting a non-voter that has caught up failed; trying again", "id", s.ID, "err", err)
				continue
			}
			n.log.Info("added a voter", "id", s.ID, "address", s.Address)
		}
		for id := range marks {
			if !seen[id] {
				delete(marks, id)
			}
		}
	}
}

// replaceQuarantine is how long a raft address stays unused after the
// member that had it was replaced.
const replaceQuarantine = 5 * time.Second

func (n *Node) noteReplaced(addr string) {
	n.replacedMu.Lock()
	defer n.replacedMu.Unlock()
	if n.replaced == nil {
		n.replaced = map[string]time.Time{}
	}
	n.replaced[addr] = time.Now()
}

func (n *Node) replacedWait(addr string) time.Duration {
	n.replacedMu.Lock()
	defer n.replacedMu.Unlock()
	at, ok := n.replaced[addr]
	if !ok {
		return 0
	}
	wait := replaceQuarantine - time.Since(at)
	if wait <= 0 {
		delete(n.replaced, addr)
		return 0
	}
	return wait
}

func (n *Node) removeLocal(id string) error {
	if !n.IsLeader() {
		return ErrNotLeader
	}
	servers, err := n.configuration()
	if err != nil {
		return err
	}
	found := false
	for _, s := range servers {
		found = found || s.ID == id
	}
	if !found {
		return &Error{Code: "member_not_found", Message: fmt.Sprintf("no member %q in the cluster; GET /api/v1/cluster lists the members", id)}
	}
	if len(servers) == 1 {
		return &Error{Code: "last_member", Message: "the last member of a cluster cannot be removed"}
	}
	var addr string
	for _, s := range servers {
		if s.ID == id {
			addr = s.Address
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.changeConf(ctx, pb.ConfChangeRemoveNode, id, addr); err != nil {
		return err
	}
	n.log.Info("removed a member", "id", id)
	return nil
}

// NodeStatus is one node's own view.
type NodeStatus struct {
	ID            string `json:"id"`
	State         string `json:"state"` // Leader, Follower, Candidate, Shutdown
	Ready         bool   `json:"ready"` // CanServe
	Term          uint64 `json:"term"`
	CommitIndex   uint64 `json:"commitIndex"`
	AppliedIndex  uint64 `json:"appliedIndex"` // of the state store
	LastLogIndex  uint64 `json:"lastLogIndex"`
	SnapshotIndex uint64 `json:"snapshotIndex"`
	// SnapshotRestores counts snapshots installed from a leader since start.
	SnapshotRestores uint64 `json:"snapshotRestores"`
	Leader           string `json:"leader"`
	LeaderAddress    string `json:"leaderAddress"`
	// LastContactMs is the time since this follower heard from its leader.
	LastContactMs int64 `json:"lastContactMs,omitempty"`
	// Checksum of the state (only when asked for): equal on nodes at the
	// same applied index.
	Checksum string `json:"checksum,omitempty"`
}

// Member is a server of the configuration with what it reports.
type Member struct {
	ID        string      `json:"id"`
	Address   string      `json:"address"`
	Suffrage  string      `json:"suffrage"`
	Leader    bool        `json:"leader"`
	Reachable bool        `json:"reachable"`
	Error     string      `json:"error,omitempty"`
	Status    *NodeStatus `json:"status,omitempty"`
}

// ClusterStatus is the cluster as this node sees it.
type ClusterStatus struct {
	Node          string   `json:"node"`
	Leader        string   `json:"leader"`
	LeaderAddress string   `json:"leaderAddress"`
	Term          uint64   `json:"term"`
	CommitIndex   uint64   `json:"commitIndex"`
	AppliedIndex  uint64   `json:"appliedIndex"`
	Members       []Member `json:"members"`
}

// LocalStatus is this node's own view (no network).
func (n *Node) LocalStatus(checksum bool) NodeStatus {
	la, lid := n.LeaderAddr()
	rs := etcdraft.StateType(n.rstate.Load())
	st := NodeStatus{
		ID: n.id, State: stateName(rs), Ready: n.CanServe(),
		Term: n.Term(), CommitIndex: n.CommitIndex(), AppliedIndex: n.store.AppliedIndex(),
		LastLogIndex: n.LastIndex(), SnapshotIndex: n.logs.snapshotIndex(), SnapshotRestores: n.fsm.restores.Load(),
		Leader: lid, LeaderAddress: la,
	}
	if n.closed.Load() {
		st.State = "Shutdown"
	}
	if rs == etcdraft.StateFollower {
		if lc := n.lastContactTime(); !lc.IsZero() {
			st.LastContactMs = time.Since(lc).Milliseconds()
		}
	}
	if checksum && !n.closed.Load() {
		n.fsm.restoring.RLock()
		sum, err := n.store.Checksum()
		n.fsm.restoring.RUnlock()
		if err == nil {
			st.Checksum = fmt.Sprintf("%016x", sum)
		}
	}
	return st
}

// Cluster reports the members, the leader and each member's own status,
// asked over the node RPC (unreachable members are marked so).
func (n *Node) Cluster(ctx context.Context, checksum bool) ClusterStatus {
	la, lid := n.LeaderAddr()
	out := ClusterStatus{Node: n.id, Leader: lid, LeaderAddress: la,
		Term: n.Term(), CommitIndex: n.CommitIndex(), AppliedIndex: n.store.AppliedIndex()}
	servers, err := n.configuration()
	if err != nil {
		return out
	}
	out.Members = make([]Member, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		m := &out.Members[i]
		m.ID, m.Address, m.Suffrage, m.Leader = s.ID, s.Address, s.Suffrage, s.ID == lid
		if s.ID == n.id {
			st := n.LocalStatus(checksum)
			m.Status, m.Reachable = &st, true
			continue
		}
		// A checksum reads the whole store: seconds for millions of
		// messages, so a member asked for one gets longer to answer.
		wait := 2 * time.Second
		if checksum {
			wait = 50 * time.Second
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			resp, err := n.rpc.call(cctx, m.Address, &rpcRequest{Op: opStatus, Checksum: checksum, TimeoutNs: int64(wait)}, nil)
			if err != nil {
				m.Error = err.Error()
				return
			}
			if resp.Node == nil {
				m.Error = resp.Msg
				return
			}
			m.Status, m.Reachable = resp.Node, true
		}()
	}
	wg.Wait()
	return out
}

// joinLoop asks the member at JoinURL to add this node until it is in the
// configuration.
func (n *Node) joinLoop() {
	defer n.wg.Done()
	url := strings.TrimRight(n.cfg.JoinURL, "/")
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	url += "/api/v1/cluster/join"
	body, _ := json.Marshal(map[string]string{"id": n.id, "address": n.cfg.Advertise})
	client := &http.Client{Timeout: 30 * time.Second}
	n.log.Info("joining a cluster", "via", url, "id", n.id, "address", n.cfg.Advertise)
	for attempt := 0; ; attempt++ {
		if n.isVoter() {
			n.log.Info("joined the cluster")
			return
		}
		err := n.postJoin(client, url, body)
		if err == nil {
			n.log.Info("join accepted", "via", url)
			return
		}
		if attempt%10 == 0 {
			n.log.Warn("join failed; retrying every second", "via", url, "err", err)
		}
		select {
		case <-n.closing:
			return
		case <-time.After(time.Second):
		}
	}
}

func (n *Node) postJoin(client *http.Client, url string, body []byte) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if n.cfg.JoinToken != "" {
		req.Header.Set("Authorization", "Bearer "+n.cfg.JoinToken)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}

func (n *Node) inConfiguration() bool {
	servers, err := n.configuration()
	if err != nil {
		return false
	}
	for _, s := range servers {
		if s.ID == n.id {
			return true
		}
	}
	return false
}

// isVoter reports whether this node is a voter of the configuration.
func (n *Node) isVoter() bool {
	servers, err := n.configuration()
	if err != nil {
		return false
	}
	for _, s := range servers {
		if s.ID == n.id {
			return s.Suffrage == "Voter"
		}
	}
	return false
}
