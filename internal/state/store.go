package state

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// QueueModeGroup is the internal name of the group that queue-mode consumers
// (no consumerGroup) share.
const QueueModeGroup = "__QUEUE_MODE__"

// Wake names a queue that may have new work for its consumers.
type Wake struct {
	Tenant string
	Queue  string
}

// Store is the state machine over one Pebble database.
type Store struct {
	dir string
	db  *pebble.DB
	log *slog.Logger

	mu sync.Mutex // serializes Apply, Restore and Close
	// life guards the database's lifetime: Readers hold it shared while
	// they read, Close and Replace take it exclusively.
	life     sync.RWMutex
	meta     meta // as of the last committed batch
	applied  atomic.Uint64
	lastTime atomic.Int64
	// halted is set once a batch met a storage error (fault.go).
	halted atomic.Pointer[ApplyError]

	tenantsMu   sync.RWMutex
	tenantNames map[uint32]string

	deadline atomic.Int64 // earliest lease expiry or delayed time; 0 = none
	onWake   func(ws []Wake, at []uint64)
	// onApplied is told when AppliedIndex moves.
	onApplied func()

	// pending is the commit of the last batch, which runs while the
	// caller hands out the batch's results (see ApplyBatch).
	pending atomic.Pointer[pendingCommit]

	// cache keeps decoded records of committed state across batches. It is
	// only touched under mu; a failed batch or a restore drops it whole.
	cache         *recordCache
	cacheBytes    int64
	memTableBytes int64
	noBlockCache  bool
	manifestBytes int64
	// batches counts ApplyBatch calls; an applyCtx carries its own number,
	// so a record can tell that it was created in the running batch.
	batches uint64
	// pushBuf and pushSpans are a push's message and dedup keys and
	// values, kept between pushes (the batch copies what it is given).
	pushBuf   []byte
	pushSpans []kvSpan
	partSpans []kvSpan
	pushOrder []pushedPart
	// popMsgs is the slice a pop gathers its deliveries in, kept between
	// pops (popScratch.fit hands the result a copy of its own size).
	popMsgs []Delivered
	// inRequest and pushSlots are a push's maps of its own items (planPush,
	// writePush), kept between pushes.
	inRequest map[[3]string]int
	pushSlots map[pkey]int
	// probeHashes, probeHashed, probeIDs and probeRecs are probeNames'
	// per-item slices, kept between pushes.
	probeHashes []uint64
	probeHashed []bool
	probeIDs    []uint64
	probeRecs   []*partRec
	// recStrs holds the names and first transaction ids of the partitions
	// this store creates, for their cached records (strArena.keep).
	recStrs strArena
	// pointReads counts the point reads Apply made (tests check that a
	// push into new partitions makes none).
	pointReads uint64
	// sizer sizes each ApplyBatch's Pebble batch from its entries.
	sizer batchSizer
	// batchBytes sums the applied batches' sizes (WriteStats).
	batchBytes  atomic.Uint64
	writeStalls atomic.Int64
	fs          vfs.FS

	encMu     sync.RWMutex
	encQueues map[string]bool // tenant + "\x00" + queue of encrypted queues
}

// recStrChunk is the size of recStrs's blocks.
const recStrChunk = 16 << 10

// Options configure a Store.
type Options struct {
	Logger *slog.Logger
	// OnWake is called after a batch commits with the queues that gained
	// deliverable work, and for each the position (Position) of the last
	// command of the batch that woke it: a pop at a later position saw
	// every change the wake is for. It must not block.
	OnWake func(ws []Wake, at []uint64)
	// OnApplied is called after a batch commits, once AppliedIndex has
	// moved. It must not block.
	OnApplied func()
	// CacheBytes is the block cache's room for blocks (default 256 MiB).
	// The cache Pebble is given is larger by the memtables held in steady
	// writing, which Pebble charges against it (pebbleCacheBytes).
	CacheBytes int64
	// FS is the file system Pebble uses (nil: the operating system's). The
	// cluster wraps it so the raft log reaches the disk before the state;
	// tests inject storage errors through it.
	FS vfs.FS
	// MemTableBytes sizes one Pebble memtable (default 64 MiB); up to
	// four are held before writes stall.
	MemTableBytes int64
	// manifestBytes overrides maxManifestBytes (tests).
	manifestBytes int64
	// noBlockCache gives Pebble a cache that keeps no block, so that every
	// read reaches the files (fault tests inject errors there).
	noBlockCache bool
}

// Open opens (or creates) the store in dir.
func Open(dir string, o Options) (*Store, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CacheBytes <= 0 {
		o.CacheBytes = 256 << 20
	}
	if o.MemTableBytes <= 0 {
		o.MemTableBytes = 64 << 20
	}
	s := &Store{dir: dir, log: o.Logger, onWake: o.OnWake, onApplied: o.OnApplied, cacheBytes: o.CacheBytes, memTableBytes: o.MemTableBytes, noBlockCache: o.noBlockCache, fs: o.FS, manifestBytes: o.manifestBytes}
	if s.manifestBytes <= 0 {
		s.manifestBytes = maxManifestBytes
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

// blockSize is the uncompressed size a table's data blocks are cut at.
// Consumers read queues in key order, and every block a read loads costs a
// file read and a cache allocation; Pebble's default (4 KiB) made those a
// large part of a pop of a backlog. A point read (a record, a dedup lookup)
// is found through the filter and the index first, so larger blocks cost it
// little (docs/benchmarks.md, "Session 26: 32 KiB blocks").
const blockSize = 32 << 10

func fastestCompression() *sstable.CompressionProfile { return sstable.FastestCompression }

func (s *Store) open() error {
	// Pebble charges the memtables it holds against this cache's capacity:
	// it is made larger by them, so that blocks keep their share.
	capacity := pebbleCacheBytes(s.cacheBytes, s.memTableBytes)
	if s.noBlockCache {
		capacity = 1
	}
	cache := pebble.NewCache(capacity)
	defer cache.Unref()
	opts := &pebble.Options{
		// The Raft log is the write-ahead log (fsync'd per append). Pebble
		// flushes memtables in order, so after a crash the state is a
		// consistent prefix carrying its own applied index, and Raft replays
		// the entries after it. Snapshots flush before the log is truncated.
		DisableWAL:                  true,
		Cache:                       cache,
		Logger:                      quietLogger{s.log},
		MemTableSize:                uint64(s.memTableBytes),
		MemTableStopWritesThreshold: 4,
		// Pushed messages stream through the LSM; compacting L0 later and
		// in bigger runs rewrites them less often. A partition's new
		// messages land after its stored ones, so a flushed table that
		// spans several partitions overlaps their whole stored history in
		// the base level, and each L0 compaction rewrites all of it: the
		// more flushed tables one compaction takes, the fewer times that
		// history is rewritten (docs/benchmarks.md, "Long pushes").
		L0CompactionThreshold: 16,
		L0StopWritesThreshold: 48,
		LBaseMaxBytes:         1 << 30,
		MaxManifestFileSize:   s.manifestBytes,
		FormatMajorVersion:    storeFormat,
		FS:                    s.fs,
		EventListener: &pebble.EventListener{
			WriteStallBegin: func(pebble.WriteStallBeginInfo) { s.writeStalls.Add(1) },
		},
	}
	// A bloom filter per table lets a point read of a key that is not
	// there (the name of a partition that does not exist yet, a cursor
	// never written) skip the tables without searching their index.
	// Blocks are compressed with Pebble's fastest profile (MinLZ on amd64,
	// snappy on arm64) instead of snappy everywhere: on a snapshot's rows
	// the flush spends less CPU and writes a third fewer blob bytes
	// (docs/benchmarks.md, "Session 17"). Every block names its own
	// compression, so tables written with snappy stay readable.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		opts.Levels[i].Compression = fastestCompression
		opts.Levels[i].BlockSize = blockSize
	}
	opts.Experimental.ValueSeparationPolicy = valueSeparation
	opts.Experimental.SpanPolicyFunc = tableSpans
	db, err := pebble.Open(s.dir, opts)
	if err != nil {
		return fmt.Errorf("open store %s: %w", s.dir, err)
	}
	s.db = db
	m := meta{NextTenant: 1, NextQueue: 1, NextPart: 1, NextSub: 1, NextDLQ: 1}
	v, closer, err := db.Get(metaKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		db.Close()
		return fmt.Errorf("read meta in %s: %w", s.dir, err)
	default:
		err = json.Unmarshal(v, &m)
		closer.Close()
		if err != nil {
			db.Close()
			return fmt.Errorf("decode meta in %s: %w", s.dir, err)
		}
	}
	s.meta = m
	s.applied.Store(m.Applied)
	s.lastTime.Store(m.LastTime)
	s.cache = newRecordCache()
	names := map[uint32]string{}
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{tTenant}, UpperBound: []byte{tTenant + 1}})
	if err != nil {
		db.Close()
		return fmt.Errorf("scan tenants: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		v := it.Value()
		if len(v) == 4 {
			names[uint32(v[0])<<24|uint32(v[1])<<16|uint32(v[2])<<8|uint32(v[3])] = string(it.Key()[1:])
		}
	}
	if err := it.Close(); err != nil {
		db.Close()
		return fmt.Errorf("scan tenants: %w", err)
	}
	s.tenantsMu.Lock()
	s.tenantNames = names
	s.tenantsMu.Unlock()
	if err := s.loadEncrypted(names); err != nil {
		db.Close()
		return err
	}
	s.refreshDeadline()
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.close(true) }

// CloseUnflushed closes the store without flushing it: what is not flushed
// yet is rebuilt from the raft log at the next start. For a node whose raft
// log could not be synced, whose state must not be made durable past it.
func (s *Store) CloseUnflushed() error { return s.close(false) }

func (s *Store) close(flush bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waitCommitted()
	s.life.Lock()
	defer s.life.Unlock()
	if s.db == nil {
		return nil
	}
	// Without Pebble's WAL, unflushed state would be rebuilt from the Raft
	// log on the next start; flushing makes a clean restart replay nothing.
	if flush {
		if err := s.db.Flush(); err != nil {
			s.log.Warn("flush on close failed; the next start replays the log", "err", err)
		}
	}
	err := s.db.Close()
	s.db = nil
	if err != nil {
		return fmt.Errorf("close store %s: %w", s.dir, err)
	}
	return nil
}

// AppliedIndex is the log index of the last applied entry.
func (s *Store) AppliedIndex() uint64 { return s.applied.Load() }

// Deadline is the earliest time (µs) at which a Tick would change something;
// 0 when nothing is scheduled.
func (s *Store) Deadline() int64 { return s.deadline.Load() }

// DB exposes the database for snapshots and reads inside this module, once
// the last applied batch is in it.
func (s *Store) DB() *pebble.DB {
	s.waitCommitted()
	return s.db
}

func (s *Store) tenantName(id uint32) string {
	s.tenantsMu.RLock()
	defer s.tenantsMu.RUnlock()
	return s.tenantNames[id]
}

// refreshDeadline finds the earliest scheduled time in the time indexes.
func (s *Store) refreshDeadline() {
	var min int64
	for _, tb := range []byte{tLeaseExp, tDelayed, tKVExp, tRetention} {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tb}, UpperBound: []byte{tb + 1}})
		if err != nil {
			continue
		}
		if it.First() && len(it.Key()) >= 9 {
			if at := int64(binary.BigEndian.Uint64(it.Key()[1:9])); min == 0 || at < min {
				min = at
			}
		}
		it.Close()
	}
	s.deadline.Store(min)
}

// quietLogger routes Pebble's logs to slog at debug level (errors at error).
type quietLogger struct{ l *slog.Logger }

func (q quietLogger) Infof(format string, args ...any) {
	q.l.Debug("pebble: " + fmt.Sprintf(format, args...))
}
func (q quietLogger) Errorf(format string, args ...any) {
	q.l.Error("pebble: " + fmt.Sprintf(format, args...))
}
func (q quietLogger) Fatalf(format string, args ...any) {
	q.l.Error("pebble fatal: " + fmt.Sprintf(format, args...))
	panic(fmt.Sprintf(format, args...))
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// maxManifestBytes is the size past which Pebble starts a new MANIFEST (a
// listing of the live files, then the edits after it) once the edits since
// the last listing name more files than it does. Every flush and compaction
// appends an edit, and every snapshot's checkpoint copies and syncs the
// whole file on the apply thread: with Pebble's default of 128 MiB a
// server busy for hours would copy that much per snapshot, and replay as
// much at each start (docs/benchmarks.md, "Session 28: the work around a
// snapshot").
const maxManifestBytes = 4 << 20

// preflushRounds and preflushSmall bound FlushMemtables: it flushes again
// while more than preflushSmall bytes were applied during the previous
// round, at most preflushRounds times.
const (
	preflushRounds = 3
	preflushSmall  = 1 << 20
)

// FlushMemtables writes the memtables to tables while applies go on: it
// holds neither the apply nor the store's lock, only the database's
// lifetime. A snapshot calls it before Checkpoint, whose own flush the
// apply waits for, so that this flush holds only what was applied since
// (docs/design/durability.md, "Taking a snapshot"). It returns about how
// many bytes were applied during its last round, which the checkpoint's
// flush still has to write.
func (s *Store) FlushMemtables() (uint64, error) {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.db == nil {
		return 0, errors.New("flush: store is closed")
	}
	var left uint64
	for range preflushRounds {
		// The flush takes the memtable as it is when it starts; what is
		// applied from then on goes into the next one.
		before := s.batchBytes.Load()
		if err := s.db.Flush(); err != nil {
			return 0, fmt.Errorf("flush before a snapshot: %w", err)
		}
		if left = s.batchBytes.Load() - before; left <= preflushSmall {
			break
		}
	}
	return left, nil
}

// Checkpoint writes a consistent copy of the state into dir (which must not
// exist) and returns the applied index it reflects.
func (s *Store) Checkpoint(dir string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waitCommitted()
	if s.db == nil {
		return 0, errors.New("checkpoint: store is closed")
	}
	if err := s.db.Flush(); err != nil {
		return 0, fmt.Errorf("flush before checkpoint: %w", err)
	}
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return 0, fmt.Errorf("checkpoint into %s: %w", dir, err)
	}
	return s.meta.Applied, nil
}

// Replace closes the database, swaps in the store directory at from (made by
// a snapshot restore) and reopens it.
func (s *Store) Replace(from string, swap func(from, to string) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waitCommitted()
	s.life.Lock() // waits for open Readers
	defer s.life.Unlock()
	if s.db != nil {
		if err := s.db.Close(); err != nil {
			return fmt.Errorf("close store for restore: %w", err)
		}
		s.db = nil
	}
	s.cache = newRecordCache()
	if err := swap(from, s.dir); err != nil {
		return fmt.Errorf("swap restored store into %s: %w", s.dir, err)
	}
	return s.open()
}
