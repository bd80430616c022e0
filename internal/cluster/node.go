package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"

	"github.com/queen-mq/queen/internal/state"
)

// ErrNotLeader is returned when a write reaches a node that cannot propose.
var ErrNotLeader = errors.New("this node is not the leader")

// ErrShutdown is returned after Close.
var ErrShutdown = errors.New("node is shutting down")

// Peer is a voter of the initial configuration.
type Peer struct {
	ID      string
	Address string
}

// Config configures a node.
type Config struct {
	DataDir  string
	NodeID   string // "" = generated once and kept in DataDir/node-id
	RaftAddr string // host:port to bind for raft traffic
	// Advertise is the raft address other nodes dial; default RaftAddr.
	Advertise string
	// Peers bootstraps a new cluster once (this node included). Empty: a
	// cluster of this node alone, unless Join is set.
	Peers []Peer
	// Join: do not bootstrap; wait to be added by a running cluster.
	Join bool
	// Timing; zero values take defaults suited to one machine or a LAN.
	HeartbeatTimeout  time.Duration
	ElectionTimeout   time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64
	Logger            *slog.Logger
	OnWake            func([]state.Wake)
}

// Node is one member of the replicated log.
type Node struct {
	cfg       Config
	id        string
	log       *slog.Logger
	store     *state.Store
	raft      *raft.Raft
	wal       *raftwal.WAL
	transport *raft.NetworkTransport
	fsm       *fsm

	props    chan *proposal
	inflight chan struct{}
	closing  chan struct{}
	closed   atomic.Bool
	wg       sync.WaitGroup

	ready atomic.Bool // leader and barrier applied in this term
	// floor is an index below which every entry is known applied: raft's
	// no-op and barrier entries never reach the state machine, so the
	// store's applied index alone can stay below the commit index.
	floor atomic.Uint64
}

type proposal struct {
	cmd  state.Command
	size int
	done chan result
}

type result struct {
	val any
	err error
}

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
	}
	store, err := state.Open(filepath.Join(cfg.DataDir, "state"), state.Options{Logger: n.log, OnWake: cfg.OnWake})
	if err != nil {
		return nil, err
	}
	n.store = store
	n.fsm = &fsm{store: store, dataDir: cfg.DataDir, log: n.log}
	os.RemoveAll(filepath.Join(cfg.DataDir, "checkpoints"))

	walDir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(walDir, 0o755); err != nil {
		store.Close()
		return nil, fmt.Errorf("create raft dir %s: %w", walDir, err)
	}
	wal, err := raftwal.Open(walDir)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("open raft log %s: %w", walDir, err)
	}
	n.wal = wal
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, hclogFor(n.log, "snapshots"))
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("open snapshot store in %s: %w", cfg.DataDir, err)
	}
	adv, err := net.ResolveTCPAddr("tcp", cfg.Advertise)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("resolve raft address %s: %w", cfg.Advertise, err)
	}
	tr, err := raft.NewTCPTransportWithLogger(cfg.RaftAddr, adv, 4, 10*time.Second, hclogFor(n.log, "transport"))
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("listen for raft on %s (set QUEEN_RAFT_ADDR to a free address): %w", cfg.RaftAddr, err)
	}
	n.transport = tr

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(id)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.HeartbeatTimeout / 2
	rc.CommitTimeout = 5 * time.Millisecond
	rc.MaxAppendEntries = 256
	rc.BatchApplyCh = true
	rc.SnapshotThreshold = cfg.SnapshotThreshold
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
	r, err := raft.NewRaft(rc, n.fsm, wal, wal, snaps, tr)
	if err != nil {
		n.closeStores()
		tr.Close()
		return nil, fmt.Errorf("start raft: %w", err)
	}
	n.raft = r
	n.wg.Add(2)
	go n.proposeLoop()
	go n.watchLeadership()
	return n, nil
}

func (n *Node) closeStores() {
	if n.wal != nil {
		n.wal.Close()
	}
	if n.store != nil {
		n.store.Close()
	}
}

// ID is this node's id.
func (n *Node) ID() string { return n.id }

// Store is the local state store (for reads).
func (n *Node) Store() *state.Store { return n.store }

// Raft exposes the raft node for status pages and membership.
func (n *Node) Raft() *raft.Raft { return n.raft }

// IsLeader reports whether this node leads and has applied its barrier.
func (n *Node) IsLeader() bool { return n.ready.Load() && n.raft.State() == raft.Leader }

// CanServe reports whether requests to this node can be served now: it
// leads and has applied its barrier.
func (n *Node) CanServe() bool { return n.IsLeader() }

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
				continue
			}
			for {
				err := n.raft.Barrier(10 * time.Second).Error()
				if err == nil {
					n.floor.Store(n.raft.AppliedIndex())
					n.ready.Store(true)
					n.log.Info("leading", "term", n.raft.Stats()["term"])
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

// Submit proposes a command and returns its result once applied. Concurrent
// submissions are grouped into one log entry (group commit).
func (n *Node) Submit(ctx context.Context, cmd state.Command, size int) (any, error) {
	if n.closed.Load() {
		return nil, ErrShutdown
	}
	if !n.IsLeader() {
		return nil, ErrNotLeader
	}
	p := &proposal{cmd: cmd, size: size, done: make(chan result, 1)}
	select {
	case n.props <- p:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-n.closing:
		return nil, ErrShutdown
	}
	select {
	case r := <-p.done:
		return r.val, r.err
	case <-ctx.Done():
		// The command may still be applied; its result is dropped.
		return nil, ctx.Err()
	}
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
			first.done <- result{err: ErrShutdown}
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

func (n *Node) propose(batch []*proposal) {
	en := &state.Entry{Time: time.Now().UnixMicro(), Cmds: make([]state.Command, len(batch))}
	for i, p := range batch {
		en.Cmds[i] = p.cmd
	}
	fail := func(err error) {
		for _, p := range batch {
			p.done <- result{err: err}
		}
		<-n.inflight
	}
	data, err := state.EncodeEntry(en)
	if err != nil {
		fail(err)
		return
	}
	f := n.raft.Apply(data, 30*time.Second)
	go func() {
		if err := f.Error(); err != nil {
			if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
				err = fmt.Errorf("%w: %v", ErrNotLeader, err)
			}
			fail(err)
			return
		}
		<-n.inflight
		res, _ := f.Response().([]any)
		for i, p := range batch {
			var v any
			if i < len(res) {
				v = res[i]
			}
			p.done <- result{val: v}
		}
	}()
}

// ReadBarrier returns once this node's state includes every write that was
// acknowledged before the call (a read index through the leader).
func (n *Node) ReadBarrier(ctx context.Context) error {
	if n.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	want := n.raft.CommitIndex()
	for max(n.store.AppliedIndex(), n.floor.Load()) < want {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

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
	err := n.raft.Shutdown().Error()
	n.wg.Wait()
	n.transport.Close()
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

func hclogFor(l *slog.Logger, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:   name,
		Level:  hclog.Warn,
		Output: slogWriter{l},
	})
}

// slogWriter forwards hclog's lines to slog.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(strings.TrimSpace(string(p)))
	return len(p), nil
}

var _ io.Writer = slogWriter{}
