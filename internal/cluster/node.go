package cluster

import (
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
	waltypes "github.com/hashicorp/raft-wal/types"

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
	// StoreFS, when set, is the file system under the state store (the
	// fsync policy still syncs the raft log before each of its syncs);
	// tests inject storage errors through it.
	StoreFS vfs.FS
	// WALFS and WALMeta, when set, are the file system under the raft log's
	// segments and its metadata store; tests count and cut the power to
	// the log's fsyncs through them.
	WALFS   waltypes.VFS
	WALMeta waltypes.MetaStore
	// DiskReserve is the free space of the data directory's disk below
	// which the node refuses writes (disk.go); 0 takes DefaultDiskReserve,
	// a negative value turns the guard off.
	DiskReserve int64

	// CacheBytes and MemTableBytes size the state store's Pebble block
	// cache and memtables (0: the store's defaults).
	CacheBytes, MemTableBytes int64
	// DedupBytes bounds the memory of the results this node keeps for
	// retried requests (dedup.go; 0: DefaultDedupBytes). A smaller bound
	// covers a shorter stretch of the log: a retry from before it is
	// proposed again as a retry (pushes) or answered "outcome unknown".
	DedupBytes int
}

// Node is one member of the replicated log.
type Node struct {
	cfg       Config
	id        string
	log       *slog.Logger
	store     *state.Store
	raft      *raft.Raft
	wal       *raftwal.WAL
	stable    *closableStable // raft's view of wal's stable store (stable.go)
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
	n.fsync.walVFS, n.fsync.walMeta = cfg.WALFS, cfg.WALMeta
	storeFS := n.fsync.pebbleFS(cfg.StoreFS)
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
	n.dedup = newDedup(coverFrom, cfg.DedupBytes)
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
	logs := &guardedLog{syncedLog: &syncedLog{WAL: wal, s: n.fsync, applied: n.store.AppliedIndex, lost: n.halt}, disk: n.disk}
	n.stable = &closableStable{StableStore: wal}
	r, err := raft.NewRaft(rc, n.fsm, logs, n.stable, snaps, n.transport)
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
	if n.stable != nil {
		n.stable.close()
	}
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
