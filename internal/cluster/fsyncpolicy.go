package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	waltypes "github.com/hashicorp/raft-wal/types"

	"github.com/queen-mq/queen/internal/state"
)

// The durability policy of the raft log (QUEEN_FSYNC).
//
// With FsyncAlways an append is fsynced before it returns, so an entry
// counts towards a quorum only once it is on disk, with two exceptions:
//   - an append whose entries are all leases (pops that do not autoAck,
//     state.LeaseOnly). Its fsync is deferred as in FsyncInterval: it is
//     written to the OS and counts at once, and is synced by the next append
//     that is synced (which fsyncs every segment written since, not only its
//     own) or by the syncer within one interval. A power loss can lose such
//     a suffix of leases, which is the same event as those leases expiring
//     (docs/design/leases.md).
//   - the leader's append of its own commands (Node.ownAppend). It is
//     written to the OS and counts at once, and the syncer is asked for a
//     round at once, which runs beside the next writes and the apply. A
//     commit then means: the leader has the entry written, and every
//     follower that counted has it on disk. The replies that promise
//     durability wait until the leader's log is synced through their entry
//     (replies.go), so an answered write is on disk on a majority.
//
// With FsyncInterval the log's segment files are wrapped so that the fsync
// of an append is deferred: the append is written to the OS (it survives a
// kill of the process) and counts towards a quorum at once, and a
// background syncer fsyncs every segment written since its last round at
// least once per interval, and on close. In both modes three rules keep a
// power loss from corrupting anything:
//   - raft-wal's metadata (which segments exist, which are sealed, where a
//     truncation cut) is committed only after the segments are synced, so it
//     never names data that is not on disk;
//   - Pebble's state is made durable (any file sync, among them the
//     manifest's, which makes a flushed table part of the state) only after
//     the log is synced, so the state on disk never runs ahead of the log on
//     disk, and raft replays onto it only entries the log still holds;
//   - raft-wal checksums each append; a torn tail after a power loss is cut
//     at the last whole append, so no entry is applied in part.
type FsyncMode string

const (
	FsyncAlways   FsyncMode = "always"
	FsyncInterval FsyncMode = "interval"
)

// Bounds and default of FsyncInterval's period.
const (
	DefaultFsyncInterval = 100 * time.Millisecond
	MinFsyncInterval     = time.Millisecond
	MaxFsyncInterval     = 10 * time.Second
)

// ParseFsyncMode reads QUEEN_FSYNC's value ("" is always).
func ParseFsyncMode(s string) (FsyncMode, error) {
	switch FsyncMode(s) {
	case "", FsyncAlways:
		return FsyncAlways, nil
	case FsyncInterval:
		return FsyncInterval, nil
	}
	return "", fmt.Errorf("QUEEN_FSYNC (--fsync) = %q: want always (every acknowledged write is on disk) or interval (synced every QUEEN_FSYNC_INTERVAL_MS)", s)
}

// FsyncIntervalFromMS reads QUEEN_FSYNC_INTERVAL_MS's value.
func FsyncIntervalFromMS(ms int64) (time.Duration, error) {
	if ms < MinFsyncInterval.Milliseconds() || ms > MaxFsyncInterval.Milliseconds() {
		return 0, fmt.Errorf("QUEEN_FSYNC_INTERVAL_MS (--fsync-interval-ms) = %d: want %d to %d milliseconds", ms, MinFsyncInterval.Milliseconds(), MaxFsyncInterval.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// logSyncer defers and batches the raft log's fsyncs (FsyncInterval), and
// tracks the index through which the log is on disk in either mode.
type logSyncer struct {
	mode     FsyncMode
	interval time.Duration
	log      *slog.Logger
	// wal is the log once it is open (Pebble may sync before that).
	wal atomic.Pointer[raftwal.WAL]
	// walVFS is the file system under the log's segments (nil: the OS's)
	// and walMeta raft-wal's metadata store (nil: its own); tests cut the
	// power through them.
	walVFS  waltypes.VFS
	walMeta waltypes.MetaStore
	// codec encodes the log's records (walcodec.go), set by openWAL.
	codec *walCodec

	// rmu guards files, the lanes and the rounds' order (syncrounds.go).
	rmu      sync.Mutex
	files    map[*deferredFile]struct{}
	lanes    int    // rounds whose fsyncs may run at once (1 or syncLanes)
	laneBusy []bool // the lanes in use by a round
	laneFree *sync.Cond
	last     *syncRound // the round started last
	epoch    uint64     // moved by a cut of the log's tail

	synced atomic.Uint64 // the log is on disk through this index
	begun  atomic.Uint64 // the highest index a recording round read as it began (s.rmu)
	rounds atomic.Uint64 // sync rounds that synced at least one file
	begins atomic.Uint64 // sync rounds begun, with nothing to fsync or not
	idle   atomic.Uint64 // rounds run by a writer on an idle syncer (roundTaken)
	failed atomic.Pointer[error]

	// deferring is set while syncedLog appends lease-only entries under
	// FsyncAlways: the segment's Sync then leaves the fsync to later.
	deferring atomic.Bool
	// deferred counts the appends whose fsync was deferred (FsyncAlways).
	deferred atomic.Uint64
	// owed is the last index of the leader's own appends written without
	// their fsync (FsyncAlways): until synced reaches it, this node must
	// not tell another node that its log holds them (Node.storeAppends).
	owed atomic.Uint64
	// onSynced is called after synced moves up, and onFail once after the
	// first failed fsync (both may be nil; set before openWAL).
	onSynced func()
	onFail   func(error)
	// writerSyncs says the writer of the leader's own appends gets their
	// round itself, once it has handed on the append's answers
	// (Node.syncOwn); false: the append asks a worker for it at once.
	writerSyncs bool

	// spare writes new segments ahead (FsyncAlways on the OS's file
	// system; nil otherwise).
	spare *spareSegments
	// trash unlinks the segments raft-wal drops (segtrash.go; the OS's
	// file system only).
	trash *segmentTrash

	waitMu sync.Mutex
	waitCh chan struct{} // closed and replaced when synced moves
	kick   chan struct{}
	// kickOwn asks for the round of the leader's own appends (demandOwn);
	// a worker that takes it when a round begun since covers them runs
	// none.
	kickOwn chan struct{}
	// skipped counts the kickOwn demands that found the appends covered
	// and ran no round.
	skipped atomic.Uint64
	stop    chan struct{}
	workers sync.WaitGroup
	stopped atomic.Bool
}

func newLogSyncer(mode FsyncMode, interval time.Duration, log *slog.Logger) *logSyncer {
	if mode == "" {
		mode = FsyncAlways
	}
	if interval <= 0 {
		interval = DefaultFsyncInterval
	}
	s := &logSyncer{
		mode: mode, interval: interval, log: log,
		files:    map[*deferredFile]struct{}{},
		lanes:    1,
		laneBusy: make([]bool, 1),
		waitCh:   make(chan struct{}),
		kick:     make(chan struct{}, 1),
		kickOwn:  make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	s.laneFree = sync.NewCond(&s.rmu)
	return s
}

// openWAL opens the raft log in dir under this policy.
func (s *logSyncer) openWAL(dir string, segmentSize int) (*raftwal.WAL, error) {
	var (
		wal *raftwal.WAL
		err error
	)
	// A segment size of 0 takes raft-wal's default. Both modes wrap the
	// segment files and the metadata: FsyncAlways defers lease-only appends.
	under, meta := s.walVFS, s.walMeta
	if under == nil {
		if s.mode == FsyncAlways && overlapSafe {
			// Every append's fsync is waited for: segments come from
			// spares written ahead (spareseg.go).
			s.spare = &spareSegments{log: s.log}
			size := uint64(segmentSize)
			if size == 0 {
				size = uint64(raftwal.DefaultSegmentSize)
			}
			s.spare.open(dir, size)
		}
		removeDropped(dir, s.log)
		s.trash = &segmentTrash{log: s.log}
		under = osSegmentFS(s.spare, s.trash)
	}
	if _, ok := under.(syncOpener); ok {
		// Each segment gets a sync handle per lane: two rounds' fsyncs
		// may run at once.
		s.rmu.Lock()
		s.lanes = syncLanes
		s.laneBusy = append(s.laneBusy, make([]bool, syncLanes-len(s.laneBusy))...)
		s.rmu.Unlock()
	}
	if meta == nil {
		meta = &metadb.BoltMetaDB{}
	}
	if err := finishSealedTail(dir, meta, under, s.log); err != nil {
		meta.Close()
		if s.spare != nil {
			s.spare.close()
		}
		return nil, err
	}
	s.codec = &walCodec{}
	wal, err = raftwal.Open(dir, raftwal.WithSegmentSize(segmentSize),
		raftwal.WithSegmentFiler(segment.NewFiler(dir, &deferredVFS{VFS: under, s: s})),
		raftwal.WithMetaStore(&syncedMeta{MetaStore: meta, s: s}),
		raftwal.WithCodec(s.codec))
	if err != nil {
		if s.spare != nil {
			s.spare.close()
		}
		return nil, err
	}
	// What the last run wrote may still be only in the OS (it was killed
	// before a sync): the segments it opened count as written (track), and
	// are synced before the log is called synced.
	if err := s.syncRound(); err != nil {
		wal.Close()
		if s.spare != nil {
			s.spare.close()
		}
		return nil, err
	}
	s.wal.Store(wal)
	s.setSynced(s.lastIndex())
	for i := range s.lanes {
		s.workers.Add(1)
		go s.loop(i == 0)
	}
	return wal, nil
}

// pebbleFS wraps Pebble's file system (base; nil is the OS's) so that
// every file sync first syncs the raft log: the state on disk never runs
// ahead of the log on disk.
func (s *logSyncer) pebbleFS(base vfs.FS) vfs.FS {
	if base == nil {
		base = vfs.Default
	}
	return &logFirstFS{FS: base, s: s}
}

// loop is one of the syncer's workers, one per lane: a demand that finds
// a round under way is taken by another worker, whose round starts at once
// beside it (syncrounds.go). The first worker also keeps the interval.
//
// The leader's own appends under FsyncAlways ask through kickOwn. Such a
// demand taken after a round began that covers them runs no round: the
// worker woken for it often finds that another worker, or a round chained
// at the end of one (below), got there first. And a worker whose round
// ends while own appends are uncovered (written during its fsync) runs
// their round at once, on its own goroutine, rather than leave it to a
// worker still waiting to be scheduled.
func (s *logSyncer) loop(ticks bool) {
	defer s.workers.Done()
	var tick <-chan time.Time
	if ticks {
		t := time.NewTicker(s.interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-s.stop:
			return
		case <-tick:
		case <-s.kick:
		case <-s.kickOwn:
			if !s.uncovered() {
				s.skipped.Add(1)
				continue
			}
		}
		s.syncRound()
		for s.uncovered() && s.failed.Load() == nil && !s.stopped.Load() {
			s.syncRound()
		}
	}
}

// fail records a failed fsync: the node accepts no more appends, and no
// later fsync counts (after a failed fsync the OS may have dropped the
// unsynced pages, and a later one that succeeds does not bring them back).
func (s *logSyncer) fail(err error) error {
	if s.failed.CompareAndSwap(nil, &err) {
		s.log.Error("raft log fsync failed: writes since the last sync may not be on disk, and this node accepts no more appends; check the disk, then restart the node", "err", err)
		if s.onFail != nil {
			s.onFail(err)
		}
	}
	return *s.failed.Load()
}

// demand asks the syncer for a round at once (a round already under way
// is joined by one more on the other lane, or followed by one).
func (s *logSyncer) demand() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// owes reports whether the leader's own appends written without their
// fsync are not all synced yet.
func (s *logSyncer) owes() bool {
	return s.owed.Load() > s.synced.Load()
}

// syncBeforeState is Pebble's hook: the log reaches the disk first (with
// FsyncAlways only deferred leases are left to sync, usually none).
func (s *logSyncer) syncBeforeState() error {
	return s.syncRound()
}

// lastIndex is the log's last written index (0 before it is open or
// after it is closed).
func (s *logSyncer) lastIndex() uint64 {
	w := s.wal.Load()
	if w == nil {
		return 0
	}
	i, _ := w.LastIndex()
	return i
}

func (s *logSyncer) setSynced(i uint64) {
	if up := s.storeSynced(i); up && s.onSynced != nil {
		s.onSynced()
	}
}

// storeSynced records the log as on disk through i and wakes the waiters;
// it reports whether that moved the index up.
func (s *logSyncer) storeSynced(i uint64) bool {
	s.waitMu.Lock()
	up := i > s.synced.Load()
	s.synced.Store(i)
	close(s.waitCh)
	s.waitCh = make(chan struct{})
	s.waitMu.Unlock()
	return up
}

// advanceSynced records the log as on disk through i unless it is already
// recorded further.
func (s *logSyncer) advanceSynced(i uint64) {
	if up := s.raiseSynced(i); up && s.onSynced != nil {
		s.onSynced()
	}
}

// raiseSynced is advanceSynced without calling onSynced; it reports
// whether the index moved up.
func (s *logSyncer) raiseSynced(i uint64) bool {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if i <= s.synced.Load() {
		return false
	}
	s.synced.Store(i)
	close(s.waitCh)
	s.waitCh = make(chan struct{})
	return true
}

// truncatedTail lowers the synced index when the log's tail is cut (a
// follower dropping entries a new leader replaces): the entries rewritten
// at those indexes are not synced yet.
func (s *logSyncer) truncatedTail(from uint64) {
	if from == 0 {
		return
	}
	// A round under way read the last index before the cut: the epoch
	// keeps it from recording the rewritten entries as synced.
	s.rmu.Lock()
	s.epoch++
	if s.synced.Load() >= from {
		s.storeSynced(from - 1)
	}
	if s.begun.Load() >= from {
		s.begun.Store(from - 1)
	}
	s.rmu.Unlock()
	// The cut entries need no fsync; those before them still do.
	for {
		o := s.owed.Load()
		if o < from || s.owed.CompareAndSwap(o, from-1) {
			break
		}
	}
}

// Synced is the index through which this node's log is on disk.
func (s *logSyncer) Synced() uint64 {
	return s.synced.Load()
}

// waitSynced blocks until this node's log is on disk through idx, asking
// the syncer for an early round.
func (s *logSyncer) waitSynced(done <-chan struct{}, idx uint64) error {
	for {
		s.waitMu.Lock()
		ch := s.waitCh
		s.waitMu.Unlock()
		if s.Synced() >= idx {
			return nil
		}
		if p := s.failed.Load(); p != nil {
			return *p
		}
		if s.stopped.Load() {
			return ErrShutdown
		}
		s.demand()
		select {
		case <-ch:
		case <-done:
			return errWaitEnded
		case <-time.After(s.interval):
		}
	}
}

var errWaitEnded = errors.New("wait for the raft log to be synced ended")

// close stops the syncer after a last round; every write is then on disk.
func (s *logSyncer) close() error {
	if !s.stopped.CompareAndSwap(false, true) {
		return nil
	}
	if s.wal.Load() == nil {
		return nil
	}
	close(s.stop)
	s.workers.Wait()
	if s.spare != nil {
		s.spare.close()
	}
	if s.trash != nil {
		s.trash.close()
	}
	return s.syncRound()
}

// syncedMeta commits raft-wal's metadata only after the segments it
// describes are on disk.
type syncedMeta struct {
	waltypes.MetaStore
	s *logSyncer
}

// Load is raft-wal's first call after it checked the codec: from here on
// the codec declares BinaryCodec's id (walCodec).
func (m *syncedMeta) Load(dir string) (waltypes.PersistentState, error) {
	if m.s.codec != nil {
		m.s.codec.declare()
	}
	return m.MetaStore.Load(dir)
}

func (m *syncedMeta) CommitState(st waltypes.PersistentState) error {
	if err := m.s.syncSegments(); err != nil {
		return err
	}
	return m.MetaStore.CommitState(st)
}

// syncedLog is the raft log as raft sees it: raft-wal, with lease-only
// appends and the leader's own deferred (FsyncAlways), the synced index
// kept, and tail truncations reported to the syncer.
type syncedLog struct {
	*raftwal.WAL
	s  *logSyncer
	mu sync.Mutex // one append at a time, so deferring is this append's
	// applied is the state's applied index and lost stops the node (nil
	// in tests of the log alone): see checkCut.
	applied func() uint64
	lost    func(error)
}

func (l *syncedLog) StoreLog(log *walRecord) error { return l.StoreLogs([]*walRecord{log}) }

func (l *syncedLog) StoreLogs(logs []*walRecord) error { return l.storeLogs(logs, false) }

// storeLogs appends logs; own says they are the leader's own commands
// (Node.ownAppend), written without their fsync, which the syncer is asked
// for at once.
func (l *syncedLog) storeLogs(logs []*walRecord, own bool) error {
	if l.s.mode == FsyncInterval || len(logs) == 0 {
		return l.writeChunks(logs, false)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lease := leaseOnly(logs)
	err := l.writeChunks(logs, lease || own) // sets deferring (walchunk.go)
	l.s.deferring.Store(false)
	if err != nil {
		return err
	}
	last := logs[len(logs)-1].Index
	switch {
	case lease:
		// Leases create no demand: synced by the next synced write or
		// within the interval.
		l.s.deferred.Add(1)
	case own:
		l.s.deferred.Add(1)
		l.s.owed.Store(last)
		if !l.s.writerSyncs {
			l.s.demandOwn()
		}
	default:
		// Synced, with every deferred append before it.
		l.s.advanceSynced(last)
	}
	return nil
}

// checkCut refuses to cut the log's tail below the state's applied index.
// Raft cuts a follower's tail only where a new leader's log differs, which
// never reaches an applied (committed) entry unless a power loss of a
// majority lost entries that this node had synced and applied (deferred
// leases under FsyncAlways, an interval's writes under FsyncInterval).
// The state then holds entries the cluster no longer has: applying on
// would diverge, so the node stops (docs/design/leases.md). A cut from the
// log's first index is a snapshot install's, whose state covers it.
func (l *syncedLog) checkCut(min, max, last uint64) error {
	if l.applied == nil || max < last || min == 0 {
		return nil
	}
	first, err := l.WAL.FirstIndex()
	if err != nil || min <= first {
		return nil
	}
	applied := l.applied()
	if min > applied {
		return nil
	}
	err = fmt.Errorf("the new leader's log differs from index %d, and this node's state has applied entries through %d: a power loss of most of the cluster lost entries this node had synced; move this node's data directory away and bring it back as a new member with an empty one through QUEEN_JOIN (docs/cluster.md), which copies the state from the leader", min, applied)
	if l.lost != nil {
		l.lost(err)
	}
	return err
}

// leaseOnly reports whether every entry of an append is a command entry
// holding only leases (state.LeaseOnly).
func leaseOnly(logs []*walRecord) bool {
	for _, l := range logs {
		if l.Type != walCommand || len(l.Extensions) > 0 {
			return false
		}
		if _, data := unwrapEntry(l.Data); !state.LeaseOnly(data) {
			return false
		}
	}
	return true
}

func (l *syncedLog) DeleteRange(min, max uint64) error {
	last, err := l.WAL.LastIndex()
	if err != nil {
		return err
	}
	if err := l.checkCut(min, max, last); err != nil {
		return err
	}
	if err := l.WAL.DeleteRange(min, max); err != nil {
		return err
	}
	if max >= last {
		l.s.truncatedTail(min)
	}
	return nil
}

// logFirstFS is Pebble's file system, whose file syncs first sync the raft
// log.
type logFirstFS struct {
	vfs.FS
	s *logSyncer
}

func (fs *logFirstFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &logFirstFile{File: f, s: fs.s}, nil
}

func (fs *logFirstFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.wrap(fs.FS.Create(name, c))
}

func (fs *logFirstFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	return fs.wrap(fs.FS.OpenReadWrite(name, c, opts...))
}

func (fs *logFirstFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	return fs.wrap(fs.FS.ReuseForWrite(oldname, newname, c))
}

func (fs *logFirstFS) OpenDir(name string) (vfs.File, error) {
	return fs.wrap(fs.FS.OpenDir(name))
}

func (fs *logFirstFS) Unwrap() vfs.FS { return fs.FS }

type logFirstFile struct {
	vfs.File
	s *logSyncer
}

func (f *logFirstFile) Sync() error {
	if err := f.s.syncBeforeState(); err != nil {
		return fmt.Errorf("sync the raft log before the state: %w", err)
	}
	return f.File.Sync()
}

func (f *logFirstFile) SyncData() error {
	if err := f.s.syncBeforeState(); err != nil {
		return fmt.Errorf("sync the raft log before the state: %w", err)
	}
	return f.File.SyncData()
}
