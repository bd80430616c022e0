package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"

	"github.com/queen-mq/queen/internal/state"
)

// ErrNotLeader is returned when no leader could take a write or confirm a
// read before the caller's context ended (no leader elected, the leader
// unreachable, this node cut off from the majority).
var ErrNotLeader = errors.New("no reachable leader")

// ErrShutdown is returned after Close.
var ErrShutdown = errors.New("node is shutting down")

// ErrOutcomeUnknown is returned for a command that may or may not have been
// applied: the leader it was sent to failed, and the new leader cannot tell
// (see dedup.go). It wraps ErrNotLeader, so it reads as "unavailable".
var ErrOutcomeUnknown = fmt.Errorf("%w: the leader changed while this request was in flight and its outcome cannot be determined; read the current state before retrying", ErrNotLeader)

// Peer is a voter of the initial configuration.
type Peer struct {
	ID      string
	Address string
}

// Config configures a node.
type Config struct {
	DataDir  string
	NodeID   string // "" = generated once and kept in DataDir/node-id
	RaftAddr string // host:port to bind for raft traffic (and node RPC)
	// Advertise is the raft address other nodes dial; default RaftAddr.
	Advertise string
	// Peers bootstraps a new cluster once (this node included). Empty: a
	// cluster of this node alone, unless Join or JoinURL is set.
	Peers []Peer
	// Join: do not bootstrap; wait to be added by a running cluster.
	Join bool
	// JoinURL is the HTTP address of any member of a running cluster. A node
	// without raft state asks it (POST /api/v1/cluster/join) to add this
	// node as a voter, again and again until that works. Implies Join.
	JoinURL string
	// JoinToken is sent as a bearer token with the join request (an
	// operator token, when the cluster has auth on).
	JoinToken string
	// ClusterKey, shared by every node, authenticates peers on the node
	// port (peerauth.go); at least MinClusterKeyLen bytes.
	ClusterKey string
	// PeerTLS*File enable mutual TLS on the node port: this node's PEM
	// certificate and key, and the CA that signs every node's certificate.
	PeerTLSCertFile, PeerTLSKeyFile, PeerTLSCAFile string
	// SourceIP, when set, is the local IP of outgoing raft and node-RPC
	// connections (hosts with several addresses; tests use it to tell
	// nodes apart at a fault-injecting proxy).
	SourceIP string
	// Timing; zero values take defaults suited to one machine or a LAN.
	HeartbeatTimeout  time.Duration
	ElectionTimeout   time.Duration
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	// WALSegmentSize is the size of a raft log segment file (0: raft-wal's
	// 64 MiB). The log is truncated behind a snapshot a whole segment at a
	// time, so a lagging follower is sent a snapshot only once the entries
	// it needs are in a dropped segment; tests make segments small.
	WALSegmentSize int
	Logger         *slog.Logger
	OnWake         func([]state.Wake)

	// Fsync is the raft log's durability policy ("" = FsyncAlways), and
	// FsyncInterval the period of FsyncInterval's syncer (0 = 100 ms); see
	// fsyncpolicy.go.
	Fsync         FsyncMode
	FsyncInterval time.Duration
	// StoreFS, when set, is the file system of the state store in place of
	// the one the fsync policy chooses; tests inject storage errors
	// through it.
	StoreFS vfs.FS
	// DiskReserve is the free space of the data directory's disk below
	// which the node refuses writes (disk.go); 0 takes DefaultDiskReserve,
	// a negative value turns the guard off.
	DiskReserve int64

	// CacheBytes and MemTableBytes size the state store's Pebble block
	// cache and memtables (0: the store's defaults).
	CacheBytes, MemTableBytes int64
}

// Node is one member of the replicated log.
type Node struct {
	cfg       Config
	id        string
	log       *slog.Logger
	store     *state.Store
	raft      *raft.Raft
	wal       *raftwal.WAL
	fsync     *logSyncer
	transport *trackedTransport
	mux       *muxLayer
	fsm       *fsm
	dedup     *dedup
	rpc       *rpcClient

	props    chan *proposal
	inflight chan struct{}
	closing  chan struct{}
	closed   atomic.Bool
	wg       sync.WaitGroup
	// rpcGate is held shared by every node-RPC handler in flight; Close
	// takes it exclusively before closing the stores.
	rpcGate sync.RWMutex

	ready atomic.Bool // leader and barrier applied in this term
	// floor is an index below which every entry is known applied: raft's
	// no-op and barrier entries never reach the state machine, so the
	// store's applied index alone can stay below the commit index.
	floor atomic.Uint64

	applyMu sync.Mutex
	applyCh chan struct{} // closed and replaced after every apply

	replacedMu sync.Mutex
	replaced   map[string]time.Time // raft address -> when its member was replaced

	disk *diskGuard // free space of the data directory (disk.go)

	haltOnce sync.Once
	halted   chan struct{} // closed when the state machine stopped (halt.go)
	haltErr  atomic.Pointer[error]
}

// proposal is one command on its way into the log. Several callers may wait
// for it (a retry that finds the original still in flight).
type proposal struct {
	id   reqID
	cmd  state.Command
	size int
	done chan struct{} // closed once res is set
	res  result
}

type result struct {
	val any
	err error
	oc  outcome
}

// outcome classifies a failed attempt.
type outcome int

const (
	outNotApplied outcome = iota // certainly not applied: try again freely
	outMaybe                     // may have been applied: try again as a retry
	outFinal                     // give up with this error
)

// LoadNodeID returns the node id kept in dataDir, creating one if needed.
func LoadNodeID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "node-id")
	if b, err := os.ReadFile(path); err == nil {
		id := strings.TrimSpace(string(b))
		if id != "" {
			return id, nil
		}
	} else if !os.IsNotExist(err) {
		return "", fmt.Errorf("read node id %s: %w", path, err)
	}
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate node id: %w", err)
	}
	id := "node-" + hex.EncodeToString(b[:])
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return "", fmt.Errorf("create data dir %s: %w", dataDir, err)
	}
	if err := os.WriteFile(path, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("write node id %s: %w", path, err)
	}
	return id, nil
}

// Open starts a node: it opens the state store and the raft log, and
// bootstraps a new cluster when there is no raft state yet.
func Open(cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = 500 * time.Millisecond
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = 500 * time.Millisecond
	}
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = 16384
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 4096
	}
	if cfg.SnapshotInterval == 0 {
		cfg.SnapshotInterval = 30 * time.Second
	}
	if cfg.JoinURL != "" {
		cfg.Join = true
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", cfg.DataDir, err)
	}
	id := cfg.NodeID
	if id == "" {
		var err error
		if id, err = LoadNodeID(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	if cfg.Advertise == "" {
		cfg.Advertise = cfg.RaftAddr
	}
	n := &Node{
		cfg: cfg, id: id, log: cfg.Logger.With("node", id),
		props:    make(chan *proposal, 4096),
		inflight: make(chan struct{}, 8),
		closing:  make(chan struct{}),
		applyCh:  make(chan struct{}),
		halted:   make(chan struct{}),
	}
	n.disk = newDiskGuard(cfg.DataDir, cfg.DiskReserve, n.log)
	if err := recoverInstall(cfg.DataDir, n.log); err != nil {
		return nil, err
	}
	n.fsync = newLogSyncer(cfg.Fsync, cfg.FsyncInterval, n.log)
	storeFS := n.fsync.pebbleFS()
	if cfg.StoreFS != nil {
		storeFS = cfg.StoreFS
	}
	store, err := state.Open(filepath.Join(cfg.DataDir, stateDirName), state.Options{Logger: n.log, OnWake: cfg.OnWake, OnApplied: n.notifyApplied, FS: storeFS,
		CacheBytes: cfg.CacheBytes, MemTableBytes: cfg.MemTableBytes})
	if err != nil {
		return nil, explainLocked(cfg.DataDir, err)
	}
	n.store = store
	os.RemoveAll(filepath.Join(cfg.DataDir, "checkpoints"))

	walDir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(walDir, 0o755); err != nil {
		store.Close()
		return nil, fmt.Errorf("create raft dir %s: %w", walDir, err)
	}
	wal, err := n.fsync.openWAL(walDir, cfg.WALSegmentSize)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("open raft log %s: %w", walDir, err)
	}
	n.wal = wal
	snaps, err := newSnapStore(cfg.DataDir, 2, n.log)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("open snapshot store in %s: %w", cfg.DataDir, err)
	}
	// Raft replays the log from just after its newest snapshot, so every
	// request id from there on passes through the applied index again.
	coverFrom := uint64(1)
	if list, err := snaps.List(); err == nil && len(list) > 0 {
		coverFrom = list[0].Index + 1
	}
	n.dedup = newDedup(coverFrom)
	n.fsm = &fsm{store: store, dataDir: cfg.DataDir, snaps: snaps, log: n.log, dedup: n.dedup, onApply: n.notifyApplied,
		onHalt: n.halt, closing: n.closing}
	if err := n.fsm.catchUp(); err != nil {
		n.closeStores()
		return nil, err
	}

	adv, err := net.ResolveTCPAddr("tcp", cfg.Advertise)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("resolve raft address %s: %w", cfg.Advertise, err)
	}
	pa, err := newPeerAuth(&cfg)
	if err != nil {
		n.closeStores()
		return nil, err
	}
	mux, err := newMuxLayer(cfg.RaftAddr, adv, cfg.SourceIP, pa, n.log)
	if errors.Is(err, errOpenNodePort) {
		n.closeStores()
		return nil, err
	}
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("listen for raft on %s (set QUEEN_RAFT_ADDR to a free address): %w", cfg.RaftAddr, err)
	}
	n.log.Info("node port listening", "addr", cfg.RaftAddr, "peer_auth", pa.describe())
	n.mux = mux
	mux.rpc = n.serveRPC
	n.rpc = newRPCClient(n)
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  mux,
		MaxPool: 4,
		Timeout: 10 * time.Second,
		Logger:  hclogFor(n.log, "transport"),
	})
	n.transport = newTrackedTransport(tr)
	go mux.serve()

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(id)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.HeartbeatTimeout / 2
	rc.CommitTimeout = 5 * time.Millisecond
	rc.MaxAppendEntries = 256
	rc.BatchApplyCh = true
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.NoSnapshotRestoreOnStart = true
	rc.Logger = hclogFor(n.log, "raft")

	has, err := raft.HasExistingState(wal, wal, snaps)
	if err != nil {
		n.closeStores()
		tr.Close()
		return nil, fmt.Errorf("inspect raft state: %w", err)
	}
	if !has && !cfg.Join {
		peers := cfg.Peers
		if len(peers) == 0 {
			peers = []Peer{{ID: id, Address: cfg.Advertise}}
		}
		conf := raft.Configuration{}
		for _, p := range peers {
			conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address)})
		}
		if err := raft.BootstrapCluster(rc, wal, wal, snaps, tr, conf); err != nil {
			n.closeStores()
			tr.Close()
			return nil, fmt.Errorf("bootstrap cluster: %w", err)
		}
		n.log.Info("bootstrapped a new cluster", "voters", len(peers))
	}
	logs := &guardedLog{syncedLog: &syncedLog{WAL: wal, s: n.fsync}, disk: n.disk}
	r, err := raft.NewRaft(rc, n.fsm, logs, wal, snaps, n.transport)
	if err != nil {
		n.closeStores()
		tr.Close()
		return nil, fmt.Errorf("start raft: %w", err)
	}
	n.raft = r
	logs.raft.Store(r)
	if has {
		// Before raft's first timeout: nothing has been sent yet.
		f := r.GetConfiguration()
		err := f.Error()
		if err == nil {
			err = checkMembers(f.Configuration(), id, cfg)
		}
		if err != nil {
			n.transport.shutdownRaft(r)
			n.transport.Close()
			mux.Close()
			n.rpc.close()
			n.closeStores()
			return nil, err
		}
	}
	go n.dedup.sweep(n.closing) // ends with closing; touches no store
	n.wg.Add(4)
	go n.proposeLoop()
	go n.watchLeadership()
	go n.promoteLoop() // membership.go
	go n.watchDisk()
	if cfg.JoinURL != "" && !has {
		n.wg.Add(1)
		go n.joinLoop()
	} else if cfg.Join && !has {
		n.log.Info("waiting to be added to a cluster (POST /api/v1/cluster/join on a member)", "id", id, "address", cfg.Advertise)
	}
	return n, nil
}

func (n *Node) closeStores() {
	if n.wal != nil {
		if err := n.fsync.close(); err != nil {
			n.log.Error("last raft log sync before close failed", "err", err)
		}
		n.wal.Close()
	}
	if n.store != nil {
		n.store.Close()
	}
}

// ID is this node's id.
func (n *Node) ID() string { return n.id }

// Address is the raft address other nodes dial for this node.
func (n *Node) Address() string { return n.cfg.Advertise }

// Store is the local state store (for reads).
func (n *Node) Store() *state.Store { return n.store }

// Raft exposes the raft node for status pages and membership.
func (n *Node) Raft() *raft.Raft { return n.raft }

// IsLeader reports whether this node leads and has applied its barrier.
func (n *Node) IsLeader() bool {
	return n.ready.Load() && n.raft.State() == raft.Leader && n.HaltError() == nil
}

// CanServe reports whether requests to this node can be served now: a
// leader that has applied its barrier, or a follower that heard from its
// leader recently and is a member (writes are forwarded there and reads
// confirmed there).
func (n *Node) CanServe() bool {
	if n.closed.Load() || n.HaltError() != nil {
		return false
	}
	switch n.raft.State() {
	case raft.Leader:
		return n.ready.Load()
	case raft.Follower:
		addr, id := n.raft.LeaderWithID()
		if addr == "" || string(id) == n.id {
			return false
		}
		// A node that is not (yet, or no longer) a member may still hear
		// from a leader replicating to its address.
		return time.Since(n.raft.LastContact()) < n.contactBound() && n.inConfiguration()
	default:
		return false
	}
}

// contactBound is how long a follower may go without hearing from its
// leader before it stops counting it as reachable.
func (n *Node) contactBound() time.Duration { return 2 * n.cfg.HeartbeatTimeout }

// LeaderAddr returns the raft address and id of the current leader.
func (n *Node) LeaderAddr() (string, string) {
	a, id := n.raft.LeaderWithID()
	return string(a), string(id)
}

// watchLeadership applies a barrier whenever this node becomes leader, so it
// serves only once every entry of earlier terms is applied.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	ch := n.raft.LeaderCh()
	for {
		select {
		case <-n.closing:
			return
		case isLeader := <-ch:
			n.ready.Store(false)
			if !isLeader {
				// Replication to followers has stopped; a pipelined send
				// stuck on a silent follower would otherwise stay blocked
				// (see trackedTransport).
				n.transport.closePipelines()
				continue
			}
			for {
				err := n.wait(n.raft.Barrier(10 * time.Second))
				if err == nil {
					// No command is proposed here before ready is set, so
					// the entries committed by now past the barrier's
					// predecessors are raft's own (the barrier itself, a
					// configuration): none reaches the store. (raft's
					// applied index may not count the barrier yet.)
					n.raiseFloor(max(n.raft.AppliedIndex(), n.raft.CommitIndex()))
					n.ready.Store(true)
					n.notifyApplied()
					n.log.Info("leading", "term", n.raft.CurrentTerm())
					break
				}
				if n.raft.State() != raft.Leader || n.closed.Load() {
					break
				}
				n.log.Warn("leader barrier failed; retrying", "err", err)
			}
		}
	}
}

// WaitLeader blocks until some node leads (this one or another), or ctx ends.
func (n *Node) WaitLeader(ctx context.Context) error {
	for {
		if n.IsLeader() {
			return nil
		}
		if a, _ := n.LeaderAddr(); a != "" && n.raft.State() != raft.Leader {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a leader: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// notifyApplied wakes everything waiting for the applied index to move.
func (n *Node) notifyApplied() {
	n.applyMu.Lock()
	close(n.applyCh)
	n.applyCh = make(chan struct{})
	n.applyMu.Unlock()
}

func (n *Node) appliedChanged() <-chan struct{} {
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	return n.applyCh
}

// waitApplied blocks until cond holds; cond is checked after every apply.
func (n *Node) waitApplied(ctx context.Context, cond func() bool) error {
	for {
		ch := n.appliedChanged()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.closing:
			return ErrShutdown
		case <-n.halted:
			return n.HaltError()
		}
	}
}

// request is one command submitted on this node, kept across attempts.
type request struct {
	id       reqID
	cmd      state.Command
	size     int
	retry    bool   // an earlier attempt may have been applied
	minIndex uint64 // the original cannot be at or below this log index
}

// Submit has a command applied through the leader and returns its result.
// On the leader, concurrent submissions are grouped into one log entry
// (group commit); a follower forwards the command to the leader over the
// raft port, where it joins the same group commit. When an attempt's outcome
// is unknown (the leader failed with it in flight) the same command, with
// the same ids, goes to the next leader, which answers a command it already
// applied with the recorded result instead of applying it twice. Submit
// tries until ctx ends.
func (n *Node) Submit(ctx context.Context, cmd state.Command, size int) (any, error) {
	if n.closed.Load() {
		return nil, ErrShutdown
	}
	if err := n.HaltError(); err != nil {
		return nil, err
	}
	if err := n.disk.refuse(); err != nil && !allowedWhenFull(cmd) {
		return nil, err
	}
	req := &request{id: newReqID(), cmd: cmd, size: size, minIndex: n.raft.CommitIndex()}
	bo := newBackoff()
	var lastErr error
	for {
		if n.closed.Load() {
			return nil, ErrShutdown
		}
		var (
			v   any
			oc  outcome
			err error
		)
		if n.IsLeader() {
			v, oc, err = n.submitLocal(ctx, req)
		} else if addr, id := n.raft.LeaderWithID(); addr != "" && string(id) != n.id {
			v, oc, err = n.forwardSubmit(ctx, string(addr), req)
		} else {
			oc, err = outNotApplied, errors.New("no leader is known")
		}
		if err == nil {
			return v, nil
		}
		switch oc {
		case outFinal:
			return nil, err
		case outMaybe:
			if ctx.Err() != nil && isContextErr(err) {
				// The caller gave up while its command waits in the log
				// (or on the way there); no leader changed. The command
				// is still shared with that proposal: leave it alone.
				if req.retry {
					return nil, fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
				}
				return nil, fmt.Errorf("%w (the request ended while its command was in flight; it may still be applied)", ctx.Err())
			}
			if !req.retry {
				req.retry = true
				// The state machine also checks server-generated ids of a
				// re-proposed push (belt and braces with the request id).
				if r, ok := req.cmd.(state.Retryable); ok {
					r.MarkRetry()
				}
			}
		}
		lastErr = err
		if !bo.wait(ctx, n.closing) {
			if n.closed.Load() {
				return nil, ErrShutdown
			}
			if errors.Is(lastErr, context.Canceled) || errors.Is(lastErr, context.DeadlineExceeded) {
				if req.retry {
					return nil, fmt.Errorf("%w: %v", ErrOutcomeUnknown, lastErr)
				}
				return nil, lastErr
			}
			if req.retry {
				return nil, fmt.Errorf("%w (last error: %v)", ErrOutcomeUnknown, lastErr)
			}
			return nil, fmt.Errorf("%w: no leader took the write before the deadline (last error: %v)", ErrNotLeader, lastErr)
		}
	}
}

type queuedKey struct{}

// OnQueued returns a context under which Submit calls fn once the command
// is queued for proposal on this node, as leader. A command this node
// queues after fn has run comes after it in the log. (Not called when the
// command is forwarded to another node.)
func OnQueued(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, queuedKey{}, fn)
}

// submitLocal proposes on this node, which must lead. It never forwards.
func (n *Node) submitLocal(ctx context.Context, req *request) (any, outcome, error) {
	if !n.IsLeader() {
		return nil, outNotApplied, ErrNotLeader
	}
	if err := n.disk.refuse(); err != nil && !allowedWhenFull(req.cmd) {
		return nil, outFinal, err
	}
	d := n.dedup
	d.mu.Lock()
	if p := d.pending[req.id]; p != nil {
		d.mu.Unlock()
		return n.await(ctx, p)
	}
	if a := d.applied[req.id]; a != nil {
		if a.hasVal {
			d.mu.Unlock()
			return a.val, outNotApplied, nil
		}
		// Applied before this node restarted: the result is gone.
		if !safeToRepeat(req.cmd) {
			d.mu.Unlock()
			return nil, outFinal, ErrOutcomeUnknown
		}
		markRetry(req.cmd)
	} else if req.retry && !d.covers(req.minIndex) {
		if !safeToRepeat(req.cmd) {
			d.mu.Unlock()
			return nil, outFinal, ErrOutcomeUnknown
		}
		markRetry(req.cmd)
	}
	p := &proposal{id: req.id, cmd: req.cmd, size: req.size, done: make(chan struct{})}
	d.pending[req.id] = p
	d.mu.Unlock()
	select {
	case n.props <- p:
		if fn, ok := ctx.Value(queuedKey{}).(func()); ok {
			fn()
		}
	case <-ctx.Done():
		n.dropPending(p)
		return nil, outNotApplied, ctx.Err()
	case <-n.closing:
		n.dropPending(p)
		return nil, outFinal, ErrShutdown
	}
	return n.await(ctx, p)
}

func (n *Node) dropPending(p *proposal) {
	n.dedup.mu.Lock()
	if n.dedup.pending[p.id] == p {
		delete(n.dedup.pending, p.id)
	}
	n.dedup.mu.Unlock()
}

func (n *Node) await(ctx context.Context, p *proposal) (any, outcome, error) {
	select {
	case <-p.done:
		return p.res.val, p.res.oc, p.res.err
	case <-ctx.Done():
		// The command may still be applied; its result is dropped.
		return nil, outMaybe, ctx.Err()
	case <-n.closing:
		return nil, outFinal, ErrShutdown
	case <-n.halted:
		return nil, outFinal, n.HaltError()
	}
}

func markRetry(c state.Command) {
	if r, ok := c.(state.Retryable); ok {
		r.MarkRetry()
	}
}

// safeToRepeat reports whether applying a command a second time gives the
// caller a correct answer: pushes (deduplicated by transaction id),
// transactions of pushes only, ticks, lease extensions and configure.
func safeToRepeat(c state.Command) bool {
	switch c := c.(type) {
	case *state.Push, *state.Tick, *state.ExtendLease, *state.Configure:
		return true
	case *state.Txn:
		if len(c.RequiredLeases) > 0 {
			return false
		}
		for i := range c.Ops {
			if c.Ops[i].Type != state.OpPush {
				return false
			}
		}
		return true
	}
	return false
}

const (
	maxEntryCmds  = 1024
	maxEntryBytes = 8 << 20
)

func (n *Node) proposeLoop() {
	defer n.wg.Done()
	for {
		var first *proposal
		select {
		case first = <-n.props:
		case <-n.closing:
			return
		}
		// Wait for an in-flight slot; commands queue up meanwhile and join
		// this entry, which is what makes concurrent requests share an fsync.
		select {
		case n.inflight <- struct{}{}:
		case <-n.closing:
			n.finish([]*proposal{first}, func(int) result { return result{err: ErrShutdown, oc: outFinal} })
			return
		}
		batch := []*proposal{first}
		size := first.size
	drain:
		for len(batch) < maxEntryCmds && size < maxEntryBytes {
			select {
			case p := <-n.props:
				batch = append(batch, p)
				size += p.size
			default:
				break drain
			}
		}
		n.propose(batch)
	}
}

// finish hands each proposal its result and forgets it as pending (the
// fsm has recorded it as applied by then, when it was).
func (n *Node) finish(batch []*proposal, res func(i int) result) {
	n.dedup.mu.Lock()
	for _, p := range batch {
		if n.dedup.pending[p.id] == p {
			delete(n.dedup.pending, p.id)
		}
	}
	n.dedup.mu.Unlock()
	for i, p := range batch {
		p.res = res(i)
		close(p.done)
	}
}

func (n *Node) propose(batch []*proposal) {
	en := &state.Entry{Time: time.Now().UnixMicro(), Cmds: make([]state.Command, len(batch))}
	ids := make([]reqID, len(batch))
	for i, p := range batch {
		en.Cmds[i] = p.cmd
		ids[i] = p.id
	}
	fail := func(err error, oc outcome) {
		<-n.inflight
		n.finish(batch, func(int) result { return result{err: err, oc: oc} })
	}
	data, err := state.EncodeEntry(en)
	if err != nil {
		fail(err, outFinal)
		return
	}
	f := n.raft.Apply(wrapEntry(ids, data), 30*time.Second)
	go func() {
		if err := f.Error(); err != nil {
			oc := outMaybe
			if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrEnqueueTimeout) {
				// Refused before it was appended.
				oc = outNotApplied
			}
			fail(fmt.Errorf("%w: %v", ErrNotLeader, err), oc)
			return
		}
		<-n.inflight
		res, _ := f.Response().([]any)
		n.finish(batch, func(i int) result {
			if i < len(res) {
				return result{val: res[i]}
			}
			return result{err: fmt.Errorf("command %d of entry %d has no result", i, f.Index()), oc: outFinal}
		})
	}()
}

// ReadBarrier returns once this node's state includes every write that was
// acknowledged before the call. The leader confirms it still leads and
// takes its commit index (a read index); a follower asks the leader for it
// over the raft port and waits until it has applied that far.
func (n *Node) ReadBarrier(ctx context.Context) error {
	bo := newBackoff()
	var lastErr error
	for {
		if n.closed.Load() {
			return ErrShutdown
		}
		if err := n.HaltError(); err != nil {
			return err
		}
		if n.IsLeader() {
			_, err := n.leaderReadIndex(ctx)
			if err == nil {
				return nil
			}
			lastErr = err
		} else if addr, id := n.raft.LeaderWithID(); addr != "" && string(id) != n.id {
			idx, err := n.rpc.readIndex(ctx, string(addr))
			if err == nil {
				return n.waitApplied(ctx, func() bool { return n.store.AppliedIndex() >= idx })
			}
			lastErr = err
		} else {
			lastErr = errors.New("no leader is known")
		}
		if !bo.wait(ctx, n.closing) {
			if n.closed.Load() {
				return ErrShutdown
			}
			return fmt.Errorf("%w: no leader confirmed the read before the deadline (last error: %v)", ErrNotLeader, lastErr)
		}
	}
}

// leaderReadIndex confirms leadership and waits until every committed entry
// is applied here. It returns the store's applied index then: every command
// committed before the call is at or below it (entries above it, up to the
// commit index, are raft's own no-op and barrier entries).
func (n *Node) leaderReadIndex(ctx context.Context) (uint64, error) {
	if !n.IsLeader() {
		return 0, ErrNotLeader
	}
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	want := n.raft.CommitIndex()
	applied := func() bool { return max(n.store.AppliedIndex(), n.floor.Load()) >= want }
	// Commands committed up to want are applied within moments. Entries
	// that never reach the store (raft's no-op, barrier and configuration
	// entries) can keep the store's index below want; if it has not moved
	// shortly, a barrier, applied after everything before it, shows that
	// every entry up to want is applied.
	wctx, cancel := context.WithTimeout(ctx, readSettle)
	err := n.waitApplied(wctx, applied)
	cancel()
	if err == nil {
		return n.store.AppliedIndex(), nil
	}
	if ctx.Err() != nil || errors.Is(err, ErrShutdown) {
		return 0, err
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if err := n.wait(n.raft.Barrier(timeout)); err != nil {
		return 0, fmt.Errorf("%w: read barrier: %v", ErrNotLeader, err)
	}
	n.raiseFloor(want)
	return n.store.AppliedIndex(), nil
}

// readSettle is how long a linearizable read waits for the store to reach
// the commit index before it proves with a barrier that the rest are
// raft's own entries.
const readSettle = 20 * time.Millisecond

// raiseFloor raises the index below which every entry is known applied.
func (n *Node) raiseFloor(idx uint64) {
	for {
		cur := n.floor.Load()
		if idx <= cur || n.floor.CompareAndSwap(cur, idx) {
			return
		}
	}
}

// AppliedIndex is the log index of the last command applied on this node.
func (n *Node) AppliedIndex() uint64 { return n.store.AppliedIndex() }

// Close stops the node. A leader first hands leadership to another voter.
func (n *Node) Close() error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	if n.raft.State() == raft.Leader && len(n.voters()) > 1 {
		if err := n.raft.LeadershipTransfer().Error(); err != nil {
			n.log.Warn("leadership transfer before shutdown failed", "err", err)
		}
	}
	close(n.closing)
	err := n.transport.shutdownRaft(n.raft)
	n.wg.Wait()
	n.transport.Close()
	n.mux.Close()
	n.rpc.close()
	// Wait for RPC handlers still running (they hold the gate for reading)
	// before the stores they use are closed.
	n.rpcGate.Lock()
	n.rpcGate.Unlock() //lint:ignore SA2001 the empty section is the wait
	n.closeStores()
	if err != nil {
		return fmt.Errorf("shutdown raft: %w", err)
	}
	return nil
}

func (n *Node) voters() []raft.Server {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var out []raft.Server
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, s)
		}
	}
	return out
}

// backoff paces retries: 5 ms doubling to 100 ms.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 5 * time.Millisecond} }

// wait sleeps the next interval; false when ctx ended or the node closes.
func (b *backoff) wait(ctx context.Context, closing <-chan struct{}) bool {
	t := time.NewTimer(b.d)
	defer t.Stop()
	if b.d < 100*time.Millisecond {
		b.d *= 2
	}
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	case <-closing:
		return false
	}
}
