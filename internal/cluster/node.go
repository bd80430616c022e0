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
	raftwal "github.com/hashicorp/raft-wal"
	waltypes "github.com/hashicorp/raft-wal/types"
	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

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
	// SnapshotLogBytes also takes a snapshot once the entries applied
	// since the last one hold this many bytes, and TrailingLogBytes bounds
	// the log kept behind a snapshot by bytes as TrailingLogs does by
	// entries (0: DefaultSnapshotLogBytes, DefaultTrailingLogBytes).
	SnapshotLogBytes uint64
	TrailingLogBytes uint64
	// WALSegmentSize is the size of a raft log segment file (0: raft-wal's
	// 64 MiB). The log is truncated behind a snapshot a whole segment at a
	// time, so a lagging follower is sent a snapshot only once the entries
	// it needs are in a dropped segment; tests make segments small.
	WALSegmentSize int
	Logger         *slog.Logger
	// OnWake is told the queues that may have new messages: by the state
	// store after it applies a batch, with the position of the last change
	// that woke each (state.Options.OnWake), and by the leader as soon as
	// a push is in its log (wakeEarly), with math.MaxUint64: not applied
	// yet, so no pop has seen it. It runs on the node's own goroutines and
	// must not block.
	OnWake func(ws []state.Wake, at []uint64)

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
	cfg   Config
	id    string
	rid   uint64 // raft's id for this node (raftID)
	log   *slog.Logger
	store *state.Store
	wal   *raftwal.WAL
	logs  *logStore
	fsync *logSyncer
	mux   *muxLayer
	tr    *transport
	fsm   *fsm
	dedup *dedup
	// replies holds the answers waiting for this leader's fsync (replies.go).
	replies *durableReplies
	rpc     *rpcClient

	// rn is owned by the ready loop (loop.go); everything else reaches it
	// through funcs.
	rn *etcdraft.RawNode
	// propBuf is the buffer the ready loop encodes its proposals into
	// (Node.propose): raft copies a proposal as a leader appends it, so
	// the buffer is free again once Propose returns.
	propBuf []byte
	tick    time.Duration
	funcs   chan func(*etcdraft.RawNode)
	recv    chan *pb.Message
	local   *mailbox[*pb.Message] // storage threads' answers to raft
	appendq *mailbox[*pb.Message]
	applyq  *mailbox[applyJob]
	// snapKick asks the apply thread for a snapshot now (logStore.stale).
	snapKick chan struct{}
	// snapQueued: a snapshot for the log's bytes is queued for the apply
	// thread (checkLogBytes), and snapRetry the unix nanos before which a
	// failed one is not queued again.
	snapQueued atomic.Bool
	snapRetry  atomic.Int64
	// snapWork counts the goroutines flushing the store before a queued
	// snapshot (queueSnapshot) and trimming after one (trimAfterSnapshot);
	// Close waits for them. logTrim orders the trims and the log's reset
	// to a received snapshot.
	snapWork sync.WaitGroup
	logTrim  sync.Mutex
	// preflushed, when set (tests), runs after that flush, before the
	// snapshot is queued.
	preflushed func()
	reads      map[string]chan uint64 // read index requests (ready loop)

	stopLoop, loopDone    chan struct{}
	stopStorage           chan struct{}
	appendDone, applyDone chan struct{}
	confMu                sync.Mutex // one configuration change at a time
	confWait              sync.Map   // token -> chan struct{} (conf.go)
	members               atomic.Pointer[confRecord]
	leadID, term, commit  atomic.Uint64
	leaderTerm            atomic.Uint64 // the term this node leads in, 0 when it does not
	// subDrops counts the commands this node proposed that delete
	// subscriptions (SubscriptionDrops).
	subDrops atomic.Uint64
	rstate   atomic.Int32 // etcdraft.StateType
	// raftApplied is the last index raft handed the apply thread (or a
	// snapshot installed); the log is never compacted past it, since raft
	// reads the entries after it to hand them over.
	raftApplied atomic.Uint64
	lastContact atomic.Int64 // unix nanos of the last message from the leader
	// soleVoter: this node is the configuration's only member.
	soleVoter atomic.Bool
	// applier is held by whoever applies entries or takes a snapshot: the
	// apply thread, or the ready loop (applyHere).
	applier sync.Mutex
	// applyQueued counts the jobs queued for the apply thread and not yet
	// done.
	applyQueued atomic.Int64
	// appender is held by whoever writes the log: the append thread, or
	// the ready loop (appendHere); appendQueued counts the appends queued
	// for the append thread and not yet written.
	appender     sync.Mutex
	appendQueued atomic.Int64
	// appendTaken counts the appends the append thread took (tests).
	appendTaken atomic.Uint64

	// propq holds the commands submitted on this node, for the ready loop
	// to propose (submit.go).
	propq   *mailbox[*proposal]
	closing chan struct{}
	closed  atomic.Bool
	wg      sync.WaitGroup
	// rpcGate is held shared by every node-RPC handler in flight; Close
	// takes it exclusively before closing the stores.
	rpcGate sync.RWMutex

	ready atomic.Bool // leader and an entry of its term applied

	applyMu sync.Mutex
	applyCh chan struct{} // closed and replaced after an apply, once taken
	// applyTaken: applyCh was handed to a waiter since it was made.
	applyTaken bool

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
	if cfg.SnapshotLogBytes == 0 {
		cfg.SnapshotLogBytes = DefaultSnapshotLogBytes
	}
	if cfg.TrailingLogBytes == 0 {
		cfg.TrailingLogBytes = DefaultTrailingLogBytes
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
		cfg: cfg, id: id, rid: raftID(id), log: cfg.Logger.With("node", id),
		propq:       newMailbox[*proposal](),
		closing:     make(chan struct{}),
		applyCh:     make(chan struct{}),
		halted:      make(chan struct{}),
		funcs:       make(chan func(*etcdraft.RawNode), 64),
		recv:        make(chan *pb.Message, 4096),
		local:       newMailbox[*pb.Message](),
		appendq:     newMailbox[*pb.Message](),
		applyq:      newMailbox[applyJob](),
		snapKick:    make(chan struct{}, 1),
		reads:       map[string]chan uint64{},
		stopLoop:    make(chan struct{}),
		loopDone:    make(chan struct{}),
		stopStorage: make(chan struct{}),
		appendDone:  make(chan struct{}),
		applyDone:   make(chan struct{}),
	}
	n.disk = newDiskGuard(cfg.DataDir, cfg.DiskReserve, n.log)
	if err := recoverInstall(cfg.DataDir, n.log); err != nil {
		return nil, err
	}
	n.fsync = newLogSyncer(cfg.Fsync, cfg.FsyncInterval, n.log)
	n.fsync.walVFS, n.fsync.walMeta = cfg.WALFS, cfg.WALMeta
	n.replies = &durableReplies{synced: n.fsync.Synced}
	n.fsync.onSynced = n.replies.release
	n.fsync.onFail = n.fsyncFailed
	n.fsync.writerSyncs = true
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
	// The log is replayed from just after the newest snapshot, so every
	// request id from there on passes through the applied index again.
	var newest *snapMeta
	if list, err := snaps.List(); err == nil && len(list) > 0 {
		newest = list[0]
	}
	coverFrom := uint64(1)
	if newest != nil {
		coverFrom = newest.Index + 1
	}
	n.dedup = newDedup(coverFrom, cfg.DedupBytes)
	n.fsm = &fsm{store: store, dataDir: cfg.DataDir, snaps: snaps, log: n.log, dedup: n.dedup, onApply: n.notifyApplied,
		onHalt: n.halt, closing: n.closing}
	if err := n.fsm.catchUp(); err != nil {
		n.closeStores()
		return nil, err
	}
	gl := &guardedLog{syncedLog: &syncedLog{WAL: wal, s: n.fsync, applied: n.store.AppliedIndex, lost: n.halt}, disk: n.disk,
		leader: func() bool { return n.rstate.Load() == int32(etcdraft.StateLeader) }, node: id}
	var rsnap *pb.Snapshot
	var sconf *confRecord
	if newest != nil {
		rsnap = newest.raftSnapshot()
		sconf = &confRecord{Index: newest.Index, Conf: newest.Conf, Members: newest.Members}
	}
	logs, has, err := openLogStore(wal, gl, rsnap, sconf, cfg.DataDir)
	if err != nil {
		n.closeStores()
		return nil, err
	}
	n.logs = logs
	logs.stale = func() {
		select {
		case n.snapKick <- struct{}{}:
		default:
		}
	}
	logs.onApplied = n.checkLogBytes
	n.setMembers(logs.confRecord())
	if has {
		servers, _ := n.configuration()
		if err := checkMembers(servers, id, cfg); err != nil {
			n.closeStores()
			return nil, err
		}
	}

	applied := store.AppliedIndex()
	last := logs.lastIndex()
	if applied > last {
		n.closeStores()
		return nil, fmt.Errorf("the state in %s has applied entries through %d but the raft log ends at %d: the log lost entries the state holds; move the data directory away and bring the node back as a new member with an empty one through QUEEN_JOIN (docs/cluster.md)", cfg.DataDir, applied, last)
	}
	// Raft starts from the log's start as committed and applied (what the
	// snapshot covers), not from a persisted commit index nor the state's
	// applied index: entries this node applied but the cluster lost (a
	// power loss of a majority under the lease rule or QUEEN_FSYNC=interval)
	// must still be replaceable by the leader, so that checkCut sees it and
	// stops the node. raft hands the log's entries to the state again once
	// their commit is known; the state skips what it has, and the request
	// ids of the replayed entries are recorded again (dedup.go).
	commit := min(logs.base, last)
	if logs.hs != nil {
		logs.hs.Commit = new(commit)
	} else if commit > 0 {
		logs.hs = &pb.HardState{Term: new(uint64(0)), Vote: new(uint64(0)), Commit: new(commit)}
	}
	raftApplied := commit
	n.raftApplied.Store(raftApplied)

	n.tick = max(cfg.ElectionTimeout/10, time.Millisecond)
	hb := max(int(cfg.HeartbeatTimeout/n.tick)/5, 1)
	rc := &etcdraft.Config{
		ID:                       n.rid,
		ElectionTick:             10,
		HeartbeatTick:            hb,
		Storage:                  logs,
		Applied:                  raftApplied,
		AsyncStorageWrites:       true,
		MaxSizePerMsg:            1 << 20,
		MaxCommittedSizePerReady: 64 << 20,
		MaxInflightMsgs:          256,
		CheckQuorum:              true,
		PreVote:                  true,
		StepDownOnRemoval:        true,
		Logger:                   newRaftLogger(n.log),
	}
	if rc.HeartbeatTick >= rc.ElectionTick {
		rc.HeartbeatTick = 1
	}
	rn, err := etcdraft.NewRawNode(rc)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("start raft: %w", err)
	}
	n.rn = rn
	if !has && !cfg.Join {
		peers := cfg.Peers
		if len(peers) == 0 {
			peers = []Peer{{ID: id, Address: cfg.Advertise}}
		}
		if err := rn.Bootstrap(bootstrapPeers(peers)); err != nil {
			n.closeStores()
			return nil, fmt.Errorf("bootstrap cluster: %w", err)
		}
		n.log.Info("bootstrapped a new cluster", "voters", len(peers))
	}
	n.term.Store(rn.BasicStatus().GetTerm())
	n.commit.Store(rn.BasicStatus().GetCommit())

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
	n.tr = newTransport(n)
	go mux.serve()
	n.tr.wg.Add(1)
	go n.tr.accept()
	go n.runLoop()
	go n.runAppend()
	go n.runApply()

	go n.dedup.sweep(n.closing) // ends with closing; touches no store
	n.wg.Add(2)
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
		if n.fsync.failed.Load() != nil {
			// The log may not be on disk: the state is not flushed past it.
			n.store.CloseUnflushed()
		} else {
			n.store.Close()
		}
	}
}

// ID is this node's id.
func (n *Node) ID() string { return n.id }

// Address is the raft address other nodes dial for this node.
func (n *Node) Address() string { return n.cfg.Advertise }

// Store is the local state store (for reads).
func (n *Node) Store() *state.Store { return n.store }

// Term is the raft term this node is in.
func (n *Node) Term() uint64 { return n.term.Load() }

// LeaderTerm is the term this node leads and serves in (IsLeader), 0 when
// it does not. While it reads the same non-zero term the node has led
// throughout: it applied every entry of the log itself, no snapshot was
// installed, and every command appended went through its propose.
func (n *Node) LeaderTerm() uint64 {
	t := n.leaderTerm.Load()
	if t == 0 || !n.IsLeader() || n.leaderTerm.Load() != t {
		return 0
	}
	return t
}

// SubscriptionDrops counts the commands that delete queues or consumer
// groups this node has proposed as leader; it moves before they reach the
// log.
func (n *Node) SubscriptionDrops() uint64 { return n.subDrops.Load() }

// CommitIndex is the highest log index this node knows committed.
func (n *Node) CommitIndex() uint64 { return n.commit.Load() }

// LastIndex is the index of the last entry in this node's log on disk (or
// written to the OS, per the fsync policy).
func (n *Node) LastIndex() uint64 { return n.logs.lastIndex() }

// Server is a member of the raft configuration.
type Server struct {
	ID, Address string
	Suffrage    string // Voter, Nonvoter
}

// Members lists the configuration as this node last applied it.
func (n *Node) Members() []Server {
	servers, err := n.configuration()
	if err != nil {
		return nil
	}
	out := make([]Server, len(servers))
	for i, s := range servers {
		out[i] = Server{ID: s.ID, Address: s.Address, Suffrage: s.Suffrage}
	}
	return out
}

// TransferLeadership hands leadership to the most up-to-date other voter
// and waits (up to a few election timeouts) until another node leads.
func (n *Node) TransferLeadership() error {
	if n.rstate.Load() != int32(etcdraft.StateLeader) {
		return ErrNotLeader
	}
	target := make(chan uint64, 1)
	select {
	case n.funcs <- func(rn *etcdraft.RawNode) {
		var best, bestMatch uint64
		rn.WithProgress(func(id uint64, typ etcdraft.ProgressType, pr tracker.Progress) {
			if id != n.rid && !pr.IsLearner && pr.Match >= bestMatch {
				best, bestMatch = id, pr.Match
			}
		})
		if best != 0 {
			rn.TransferLeader(best)
		}
		target <- best
	}:
	case <-n.loopDone:
		return ErrShutdown
	}
	if <-target == 0 {
		return errors.New("no other voter to hand leadership to")
	}
	deadline := time.Now().Add(5 * n.cfg.ElectionTimeout)
	for time.Now().Before(deadline) {
		if l := n.leadID.Load(); l != 0 && l != n.rid {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("leadership was not taken over in time")
}

// Close stops the node. A leader first hands leadership to another voter.
func (n *Node) Close() error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	if n.rstate.Load() == int32(etcdraft.StateLeader) && len(n.voters()) > 1 && n.HaltError() == nil {
		if err := n.TransferLeadership(); err != nil {
			n.log.Warn("leadership transfer before shutdown failed", "err", err)
		}
	}
	close(n.closing)
	n.wg.Wait()
	close(n.stopLoop)
	<-n.loopDone
	n.mux.Close()
	n.tr.close()
	close(n.stopStorage)
	<-n.appendDone
	<-n.applyDone
	// No thread that starts snapshot work runs any more.
	n.snapWork.Wait()
	n.rpc.close()
	// Wait for RPC handlers still running (they hold the gate for reading)
	// before the stores they use are closed.
	n.rpcGate.Lock()
	n.rpcGate.Unlock() //lint:ignore SA2001 the empty section is the wait
	n.closeStores()
	return nil
}

func (n *Node) voters() []server {
	servers, err := n.configuration()
	if err != nil {
		return nil
	}
	var out []server
	for _, s := range servers {
		if s.Suffrage == "Voter" {
			out = append(out, s)
		}
	}
	return out
}

// stateName is a raft state as status pages show it.
func stateName(s etcdraft.StateType) string {
	switch s {
	case etcdraft.StateLeader:
		return "Leader"
	case etcdraft.StateCandidate, etcdraft.StatePreCandidate:
		return "Candidate"
	default:
		return "Follower"
	}
}
