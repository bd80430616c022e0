package state

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/google/btree"
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
	onWake   func([]Wake)
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
	// batches counts ApplyBatch calls; a txn carries its own number, so a
	// record can tell that it was created in the running batch.
	batches uint64
	// pushBuf and pushSpans are a push's message and dedup keys and
	// values, kept between pushes (the batch copies what it is given).
	pushBuf   []byte
	pushSpans []kvSpan
	// pointReads counts the point reads Apply made (tests check that a
	// push into new partitions makes none).
	pointReads uint64
	fs         vfs.FS

	encMu     sync.RWMutex
	encQueues map[string]bool // tenant + "\x00" + queue of encrypted queues
}

// QueueEncrypted reports whether a queue is configured with
// encryptionEnabled (as of the last applied entry on this node).
func (s *Store) QueueEncrypted(tenant, queue string) bool {
	s.encMu.RLock()
	defer s.encMu.RUnlock()
	return s.encQueues[tenant+"\x00"+queue]
}

// EncryptedQueues counts the encrypted queues.
func (s *Store) EncryptedQueues() int {
	s.encMu.RLock()
	defer s.encMu.RUnlock()
	return len(s.encQueues)
}

// loadEncrypted scans the queue records for encrypted queues.
func (s *Store) loadEncrypted(names map[uint32]string) error {
	enc := map[string]bool{}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tQueue}, UpperBound: []byte{tQueue + 1}})
	if err != nil {
		return fmt.Errorf("scan queues: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		var q queueRec
		k := it.Key()
		if len(k) < 5 || json.Unmarshal(it.Value(), &q) != nil || !q.Options.EncryptionEnabled {
			continue
		}
		enc[names[binary.BigEndian.Uint32(k[1:5])]+"\x00"+q.Name] = true
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("scan queues: %w", err)
	}
	s.encMu.Lock()
	s.encQueues = enc
	s.encMu.Unlock()
	return nil
}

// recordCache holds decoded records by their Pebble key. A nil value caches
// "absent". It is derived state: dropping it changes nothing but speed.
type recordCache struct {
	tenants    map[string]uint32
	queueNames map[string]uint64
	queues     map[string]*queueRec
	partIDs    map[string]uint64 // partition-name key -> id (0 = absent)
	partLocs   map[uint64]partLoc
	parts      map[string]*partRec
	subs       map[string]*subRec
	subLists   map[string][]string
	cursors    map[string]*cursorRec
	ready      map[subRef]*readySet
	filters    map[queueRef]*nameFilter
}

// subRef names a subscription by tenant and id.
type subRef struct {
	tid uint32
	sub uint64
}

// readySet mirrors one subscription's part of the ready index (the tReady
// keys) in memory, ordered by partition id. Pop walks it instead of a
// Pebble iterator: ready keys are set and deleted at every lease, so the
// memtable holds many versions of each and an iterator has to step over
// all of them. The keys stay in Pebble (they are state, and a restart or a
// snapshot rebuilds the mirror from them); the mirror is loaded on first
// use and updated wherever a ready key is written.
type readySet = btree.BTreeG[uint64]

func newReadySet() *readySet {
	return btree.NewG[uint64](32, func(a, b uint64) bool { return a < b })
}

// maxCachedPerMap bounds each map of the cache; past it a random tenth of
// the map is dropped (a cache only: nothing depends on what it holds).
const maxCachedPerMap = 1_000_000

func trim[K comparable, V any](m map[K]V) {
	if len(m) <= maxCachedPerMap {
		return
	}
	drop := len(m) / 10
	for k := range m {
		if drop == 0 {
			return
		}
		delete(m, k)
		drop--
	}
}

// trim bounds the cache. It runs between batches, when nothing is dirty.
func (c *recordCache) trim() {
	trim(c.tenants)
	trim(c.queueNames)
	trim(c.queues)
	trim(c.partIDs)
	trim(c.partLocs)
	trim(c.parts)
	trim(c.subs)
	trim(c.cursors)
	if len(c.ready) > 10_000 {
		clear(c.ready)
	}
	if len(c.filters) > 10_000 {
		clear(c.filters)
	}
	if len(c.subLists) > maxCachedPerMap {
		clear(c.subLists)
	}
}

func newRecordCache() *recordCache {
	return &recordCache{
		tenants:    map[string]uint32{},
		queueNames: map[string]uint64{},
		queues:     map[string]*queueRec{},
		partIDs:    map[string]uint64{},
		partLocs:   map[uint64]partLoc{},
		parts:      map[string]*partRec{},
		subs:       map[string]*subRec{},
		subLists:   map[string][]string{},
		cursors:    map[string]*cursorRec{},
		ready:      map[subRef]*readySet{},
		filters:    map[queueRef]*nameFilter{},
	}
}

// Options configure a Store.
type Options struct {
	Logger *slog.Logger
	// OnWake is called after a batch commits with the queues that gained
	// deliverable work. It must not block.
	OnWake func([]Wake)
	// OnApplied is called after a batch commits, once AppliedIndex has
	// moved. It must not block.
	OnApplied func()
	// CacheBytes sizes Pebble's block cache (default 256 MiB).
	CacheBytes int64
	// FS is the file system Pebble uses (nil: the operating system's). The
	// cluster wraps it so the raft log reaches the disk before the state;
	// tests inject storage errors through it.
	FS vfs.FS
	// MemTableBytes sizes one Pebble memtable (default 64 MiB); up to
	// four are held before writes stall.
	MemTableBytes int64
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
	s := &Store{dir: dir, log: o.Logger, onWake: o.OnWake, onApplied: o.OnApplied, cacheBytes: o.CacheBytes, memTableBytes: o.MemTableBytes, fs: o.FS}
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) open() error {
	cache := pebble.NewCache(s.cacheBytes)
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
		// in bigger runs rewrites them less often. With 1 KiB payloads
		// compaction was about 40% of the server's CPU; these settings
		// gave 12-18% more pushes per second (docs/benchmarks.md).
		L0CompactionThreshold: 8,
		L0StopWritesThreshold: 48,
		LBaseMaxBytes:         1 << 30,
		FormatMajorVersion:    storeFormat,
		FS:                    s.fs,
	}
	// A bloom filter per table lets a point read of a key that is not
	// there (the name of a partition that does not exist yet, a cursor
	// never written) skip the tables without searching their index.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	opts.Experimental.ValueSeparationPolicy = valueSeparation
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

// pendingCommit is a batch being written to Pebble's memtable.
type pendingCommit struct {
	done chan struct{}
}

// waitCommitted returns once the last applied batch is in Pebble.
func (s *Store) waitCommitted() {
	if p := s.pending.Load(); p != nil {
		<-p.done
	}
}

// Close closes the database.
func (s *Store) Close() error {
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
	if err := s.db.Flush(); err != nil {
		s.log.Warn("flush on close failed; the next start replays the log", "err", err)
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

// LogEntry is one entry handed to ApplyBatch.
type LogEntry struct {
	Index uint64
	Data  []byte // nil for entries that carry no commands (config changes)
}

// ApplyBatch applies log entries in order, in one Pebble batch. It returns,
// for each entry, the results of its commands (nil for skipped entries).
// Entries at or below the applied index are skipped: replay is idempotent.
func (s *Store) ApplyBatch(entries []LogEntry) ([][]any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil, errors.New("apply: store is closed")
	}
	// The previous batch's commit must be in Pebble before this batch reads.
	s.waitCommitted()
	if e := s.halted.Load(); e != nil {
		return nil, e
	}
	s.cache.trim()
	t := s.newTxn()
	handedOff := false
	defer func() {
		if !handedOff {
			t.b.Close()
			// Cached records may hold changes that were never committed.
			s.cache = newRecordCache()
		}
	}()
	out := make([][]any, len(entries))
	for i, le := range entries {
		if le.Index <= t.m.Applied {
			continue
		}
		t.m.Applied = le.Index
		t.index = le.Index
		if le.Data == nil {
			continue
		}
		en, err := DecodeEntry(le.Data)
		if err != nil {
			// Skipping it would make this node diverge from the others.
			e := &ApplyError{Index: le.Index, Op: "decode entry", Err: err}
			s.halt(e)
			return nil, e
		}
		t.now = en.Time
		if t.now < t.m.LastTime {
			t.now = t.m.LastTime
		}
		t.m.LastTime = t.now
		res := make([]any, len(en.Cmds))
		for j, c := range en.Cmds {
			t.cmdNo = uint64(j)
			res[j] = t.apply(c)
			if t.err != nil {
				s.halt(t.err)
				return nil, t.err
			}
		}
		out[i] = res
	}
	// Dirty records are written once per batch. Records that iterations
	// must see within the batch (new partitions, subscriptions) are also
	// written through when created; every other read goes through the
	// caches, which hold the newest value.
	if err := t.flush(); err != nil {
		e := &ApplyError{Index: t.m.Applied, Op: "write the batch", Err: err}
		s.halt(e)
		return nil, e
	}
	mb, err := json.Marshal(&t.m)
	if err != nil {
		return nil, fmt.Errorf("encode meta: %w", err)
	}
	if err := t.b.Set(metaKey, mb, nil); err != nil {
		e := &ApplyError{Index: t.m.Applied, Key: metaKey, Op: "write", Err: err}
		s.halt(e)
		return nil, e
	}
	// The results are final: the entries are durable in the Raft log, and
	// applying them again after a crash gives the same results. So the
	// batch goes into Pebble's memtable (half of the apply time) while the
	// caller hands out the results; the next batch, a checkpoint, a reader
	// and Close wait for it. AppliedIndex moves only once it is in.
	handedOff = true
	p := &pendingCommit{done: make(chan struct{})}
	s.pending.Store(p)
	s.meta = t.m
	s.lastTime.Store(t.m.LastTime)
	if len(t.newTenants) > 0 {
		s.tenantsMu.Lock()
		for id, name := range t.newTenants {
			s.tenantNames[id] = name
		}
		s.tenantsMu.Unlock()
	}
	if len(t.encChanged) > 0 {
		s.encMu.Lock()
		for k, on := range t.encChanged {
			if on {
				s.encQueues[k] = true
			} else {
				delete(s.encQueues, k)
			}
		}
		s.encMu.Unlock()
	}
	go s.commit(t, p)
	return out, nil
}

// commit writes an applied batch into Pebble and then publishes it: the
// applied index, the next deadline, and the queues with new work.
func (s *Store) commit(t *txn, p *pendingCommit) {
	defer close(p.done)
	err := t.b.Commit(pebble.NoSync)
	t.b.Close()
	if err != nil {
		// The state can no longer follow the log. The entries are in the
		// Raft log, and a restart applies them again; the applied index
		// stays where it was.
		s.halt(&ApplyError{Index: t.m.Applied, Op: "commit the batch ending at this entry", Err: err})
		return
	}
	s.applied.Store(t.m.Applied)
	if s.onApplied != nil {
		s.onApplied()
	}
	switch {
	case t.ticked:
		s.refreshDeadline()
	case t.schedMin != 0:
		// Only lower it here; removals can leave it early, which costs one
		// Tick that finds nothing and recomputes it exactly.
		if d := s.deadline.Load(); d == 0 || t.schedMin < d {
			s.deadline.Store(t.schedMin)
		}
	}
	if s.onWake != nil && len(t.woken) > 0 {
		w := make([]Wake, 0, len(t.woken))
		for k := range t.woken {
			w = append(w, k)
		}
		s.onWake(w)
	}
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

// txn is the working state of one ApplyBatch: the Pebble batch, the working
// meta record and decoded-record caches. Mutated records are marked dirty and
// written at the end of the batch, in sorted key order.
type txn struct {
	s     *Store
	b     *pebble.Batch
	m     meta
	now   int64
	index uint64
	cmdNo uint64 // position of the current command in its entry
	// serial numbers the batch (Store.batches): partitions created in it
	// carry it (partRec.born).
	serial uint64
	// scratch builds keys that are only written (the batch copies them),
	// keyBuf keys that are looked up.
	scratch []byte
	keyBuf  []byte

	tenants    map[string]uint32
	newTenants map[uint32]string
	queues     map[string]*queueRec // by queue key
	queueNames map[string]uint64    // by queue-name key; 0 = absent
	partIDs    map[string]uint64    // by partition-name key; 0 = absent
	partLocs   map[uint64]partLoc   // partition id -> tenant and queue
	parts      map[string]*partRec  // by part key
	subs       map[string]*subRec   // by sub key; nil = absent
	subLists   map[string][]string  // sub keys by sub-queue prefix
	cursors    map[string]*cursorRec
	ready      map[subRef]*readySet
	filters    map[queueRef]*nameFilter
	dirty      map[string]any

	woken          map[Wake]struct{}
	encChanged     map[string]bool
	schedMin       int64 // earliest time scheduled by this batch
	ticked         bool  // a Tick ran: recompute the deadline exactly
	backfillRounds int
	err            *ApplyError // the first storage error (fault.go)
}

func (s *Store) newTxn() *txn {
	c := s.cache
	s.batches++
	return &txn{
		s:          s,
		serial:     s.batches,
		b:          s.db.NewIndexedBatch(),
		m:          s.meta,
		tenants:    c.tenants,
		newTenants: map[uint32]string{},
		queues:     c.queues,
		queueNames: c.queueNames,
		partIDs:    c.partIDs,
		partLocs:   c.partLocs,
		parts:      c.parts,
		subs:       c.subs,
		subLists:   c.subLists,
		cursors:    c.cursors,
		ready:      c.ready,
		filters:    c.filters,
		dirty:      map[string]any{},
		woken:      map[Wake]struct{}{},
		encChanged: map[string]bool{},
	}
}

// schedule notes a time written to a time-ordered index.
func (t *txn) schedule(at int64) {
	if t.schedMin == 0 || at < t.schedMin {
		t.schedMin = at
	}
}

// seq orders commands: the log index and the command's place in its entry.
// Messages record it, and "new" subscriptions start after a seq.
func (t *txn) seq() uint64 { return t.index<<20 | t.cmdNo&(1<<20-1) }

func (t *txn) apply(c Command) any {
	switch c := c.(type) {
	case *Push:
		return t.push(c)
	case *Pop:
		return t.pop(c)
	case *Ack:
		return t.ack(c)
	case *ExtendLease:
		return t.extend(c)
	case *Configure:
		return t.configure(c)
	case *DeleteQueue:
		return t.deleteQueue(c)
	case *Seek:
		return t.seek(c)
	case *DeleteGroup:
		return t.deleteGroup(c)
	case *DLQRequeue:
		return t.dlqRequeue(c)
	case *DLQDelete:
		return t.dlqDelete(c)
	case *Tick:
		t.ticked = true
		return t.tick()
	case *Txn:
		return t.txn(c)
	}
	return &CountResult{Err: &Error{Code: "unknown_command", Message: fmt.Sprintf("unknown command %T", c)}}
}

// flush writes dirty records in key order.
func (t *txn) flush() error {
	if len(t.dirty) == 0 {
		return nil
	}
	keys := make([]string, 0, len(t.dirty))
	for k := range t.dirty {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var kbuf []byte
	for _, k := range keys {
		var v []byte
		switch r := t.dirty[k].(type) {
		case *queueRec:
			b, err := json.Marshal(r)
			if err != nil {
				return fmt.Errorf("encode queue %s: %w", r.Name, err)
			}
			v = b
		case *partRec:
			// The batch copies the value: one buffer serves every record.
			t.scratch = r.appendTo(t.scratch[:0])
			v = t.scratch
			wrote := r.wrote
			r.wrote = nil
			if bytes.Equal(v, wrote) {
				continue // written through as it is (writePart)
			}
		case *subRec:
			b, err := json.Marshal(r)
			if err != nil {
				return fmt.Errorf("encode subscription %s: %w", r.Group, err)
			}
			v = b
		case *cursorRec:
			t.scratch = r.appendTo(t.scratch[:0])
			v = t.scratch
		default:
			return fmt.Errorf("flush: unexpected record %T", r)
		}
		kbuf = append(kbuf[:0], k...)
		if err := t.b.Set(kbuf, v, nil); err != nil {
			return fmt.Errorf("flush %x: %w", k, err)
		}
	}
	clear(t.dirty)
	return nil
}

// get reads a key through the batch; it returns a copy, or nil if absent.
// A read error stops the batch (see fail): "absent" would be a guess.
func (t *txn) get(k []byte) []byte {
	t.s.pointReads++
	v, closer, err := t.b.Get(k)
	if err != nil {
		if !errors.Is(err, pebble.ErrNotFound) {
			t.fail(k, "read", err)
		}
		return nil
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out
}

func (t *txn) set(k, v []byte) {
	if err := t.b.Set(k, v, nil); err != nil {
		t.fail(k, "write", err)
	}
}

func (t *txn) del(k []byte) {
	if err := t.b.Delete(k, nil); err != nil {
		t.fail(k, "delete", err)
	}
}

func (t *txn) delRange(prefix []byte) {
	if err := t.b.DeleteRange(prefix, prefixEnd(prefix), nil); err != nil {
		t.fail(prefix, "delete the range", err)
	}
}

func (t *txn) iter(prefix []byte) *pebble.Iterator {
	return t.iterRange(prefix, prefixEnd(prefix))
}

func (t *txn) iterRange(lo, hi []byte) *pebble.Iterator {
	it, err := t.b.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.fail(lo, "scan", err)
		return nil
	}
	return it
}

// closeIter closes an iterator of the batch; an error it met while
// iterating (a failed read) stops the batch.
func (t *txn) closeIter(it *pebble.Iterator) {
	k := append([]byte(nil), it.Key()...)
	if err := it.Close(); err != nil {
		t.fail(k, "scan", err)
	}
}

// corrupt stops the batch on a record that cannot be decoded.
func (t *txn) corrupt(k []byte, what string, err error) {
	t.fail(k, "decode the "+what+" record at", fmt.Errorf("%w: %v", ErrCorruptRecord, err))
}

// tenantID resolves a tenant name, creating the tenant when create is set.
func (t *txn) tenantID(name string, create bool) (uint32, bool) {
	if id, ok := t.tenants[name]; ok {
		return id, id != 0
	}
	if v := t.get(tenantKey(name)); len(v) == 4 {
		id := uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
		t.tenants[name] = id
		return id, true
	}
	if !create {
		return 0, false
	}
	id := t.m.NextTenant
	t.m.NextTenant++
	t.set(tenantKey(name), []byte{byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)})
	t.tenants[name] = id
	t.newTenants[id] = name
	return id, true
}

func (t *txn) queueIDByName(tid uint32, name string) uint64 {
	k := string(queueNameKey(tid, name))
	if id, ok := t.queueNames[k]; ok {
		return id
	}
	var id uint64
	if v := t.get([]byte(k)); len(v) == 8 {
		id = lastU64(v)
	}
	t.queueNames[k] = id
	return id
}

func (t *txn) queue(tid uint32, qid uint64) *queueRec {
	if qid == 0 {
		return nil
	}
	k := string(queueKey(tid, qid))
	if q, ok := t.queues[k]; ok {
		return q
	}
	var q *queueRec
	if v := t.get([]byte(k)); v != nil {
		q = &queueRec{}
		if err := json.Unmarshal(v, q); err != nil {
			t.corrupt([]byte(k), "queue", err)
			q = nil
		}
	}
	t.queues[k] = q
	return q
}

func (t *txn) queueByName(tid uint32, name string) *queueRec {
	return t.queue(tid, t.queueIDByName(tid, name))
}

func (t *txn) createQueue(tid uint32, name string) *queueRec {
	q := &queueRec{ID: t.m.NextQueue, Name: name, CreatedAt: t.now, Options: DefaultQueueOptions()}
	t.m.NextQueue++
	nk := queueNameKey(tid, name)
	t.set(nk, binaryU64(q.ID))
	t.queueNames[string(nk)] = q.ID
	k := string(queueKey(tid, q.ID))
	t.queues[k] = q
	t.dirty[k] = q
	// Queue mode is a subscription that reads from the oldest message.
	t.createSub(tid, q, QueueModeGroup, StartAll, 0, 0)
	return q
}

func (t *txn) markQueue(tid uint32, q *queueRec) { t.dirty[string(queueKey(tid, q.ID))] = q }

func binaryU64(v uint64) []byte {
	return []byte{byte(v >> 56), byte(v >> 48), byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

func (t *txn) partIDByName(tid uint32, qid uint64, name string) uint64 {
	return t.partIDIn(tid, qid, nil, name)
}

// partIDIn is partIDByName for a partition of q (nil: look q up only if
// needed), which lets a name that q's filter does not hold skip the read.
func (t *txn) partIDIn(tid uint32, qid uint64, q *queueRec, name string) uint64 {
	t.keyBuf = kb(append(t.keyBuf[:0], tPartName)).u32(tid).u64(qid).str(name)
	nk := t.keyBuf
	if id, ok := t.partIDs[string(nk)]; ok {
		return id
	}
	if q != nil {
		if f := t.partNames(tid, q); f != nil && !f.mayHold(name) {
			return 0
		}
	}
	var id uint64
	if v := t.get(nk); len(v) == 8 {
		id = lastU64(v)
	}
	t.partIDs[string(nk)] = id
	return id
}

func (t *txn) part(tid uint32, qid, pid uint64) *partRec {
	k := string(partKey(tid, qid, pid))
	if p, ok := t.parts[k]; ok {
		return p
	}
	var p *partRec
	if v := t.get([]byte(k)); v != nil {
		var err error
		if p, err = decodePart(v); err != nil {
			t.corrupt([]byte(k), "partition", err)
			p = nil
		} else {
			completeTail(p, tid, pid, t.iterRange)
		}
	}
	t.parts[k] = p
	return p
}

// markPart records a change of a partition field other than its tail (a
// push's new messages change only the tail: see completeTail).
func (t *txn) markPart(tid uint32, pid uint64, p *partRec) {
	p.markTail()
	t.dirty[string(partKey(tid, p.Queue, pid))] = p
}

// createPart creates a partition of q. The caller marks q dirty, and writes
// the new record through (writePart) once its first message is set.
func (t *txn) createPart(tid uint32, q *queueRec, name string) (uint64, *partRec) {
	pid := t.m.NextPart
	t.m.NextPart++
	p := &partRec{Queue: q.ID, CreatedAt: t.now, CreatedIdx: t.seq(), Name: name, born: t.serial}
	t.scratch = kb(append(t.scratch[:0], tPartName)).u32(tid).u64(q.ID).str(name)
	nk := len(t.scratch)
	t.partIDs[string(t.scratch)] = pid
	t.notePartName(tid, q.ID, name)
	t.scratch = binary.BigEndian.AppendUint64(t.scratch, pid)
	t.set(t.scratch[:nk], t.scratch[nk:])
	t.scratch = kb(append(t.scratch[:0], tPartLoc)).u32(tid).u64(pid)
	nk = len(t.scratch)
	t.scratch = binary.BigEndian.AppendUint64(t.scratch, q.ID)
	t.set(t.scratch[:nk], t.scratch[nk:])
	t.partLocs[pid] = partLoc{tid: tid, qid: q.ID}
	p.key = string(partKey(tid, q.ID, pid))
	t.parts[p.key] = p
	q.Partitions++
	return pid, p
}

// writePart writes a new partition record through at once, so that scans of
// the queue's partitions within the batch (backfill) see it; the record is
// also marked dirty. flush skips it when it has not changed since.
func (t *txn) writePart(tid uint32, pid uint64, p *partRec) {
	k := p.key
	p.key = ""
	if k == "" {
		k = string(partKey(tid, p.Queue, pid))
	}
	p.markTail()
	t.dirty[k] = p
	p.wrote = p.encode()
	t.set([]byte(k), p.wrote)
}

// partQueue returns the queue id of a partition id, 0 if unknown.
func (t *txn) partQueue(tid uint32, pid uint64) uint64 {
	// Partition ids are unique across tenants; the cached entry remembers
	// the tenant so that one tenant cannot resolve another's partition.
	if l, ok := t.partLocs[pid]; ok {
		if l.tid != tid {
			return 0
		}
		return l.qid
	}
	if v := t.get(partLocKey(tid, pid)); len(v) == 8 {
		qid := lastU64(v)
		t.partLocs[pid] = partLoc{tid: tid, qid: qid}
		return qid
	}
	return 0
}

type partLoc struct {
	tid uint32
	qid uint64
}

func (t *txn) sub(tid uint32, qid uint64, group string) *subRec {
	k := string(subKey(tid, qid, group))
	if s, ok := t.subs[k]; ok {
		return s
	}
	var s *subRec
	if v := t.get([]byte(k)); v != nil {
		s = &subRec{}
		if err := json.Unmarshal(v, s); err != nil {
			t.corrupt([]byte(k), "subscription", err)
			s = nil
		}
	}
	t.subs[k] = s
	return s
}

func (t *txn) markSub(tid uint32, qid uint64, s *subRec) {
	t.dirty[string(subKey(tid, qid, s.Group))] = s
}

func (t *txn) createSub(tid uint32, q *queueRec, group, rule string, ruleIndex uint64, ruleTime int64) *subRec {
	s := &subRec{ID: t.m.NextSub, Group: group, CreatedAt: t.now, Epoch: 1}
	t.m.NextSub++
	t.setRule(tid, q, s, rule, ruleIndex, ruleTime)
	k := string(subKey(tid, q.ID, group))
	t.subs[k] = s
	t.dirty[k] = s
	// Written through at once so that iterations over the queue's
	// subscriptions within this command see it.
	if b, err := json.Marshal(s); err == nil {
		t.set([]byte(k), b)
	}
	delete(t.subLists, string(subQueuePrefix(tid, q.ID)))
	return s
}

// setRule sets a subscription's start rule and recomputes its pending count.
func (t *txn) setRule(tid uint32, q *queueRec, s *subRec, rule string, ruleIndex uint64, ruleTime int64) {
	s.Rule, s.RuleIndex, s.RuleTime = rule, ruleIndex, ruleTime
	s.Backfill, s.BackfillPos, s.ScanPos = false, 0, 0
	switch rule {
	case StartIndex:
		s.Pending = 0
	case StartAll:
		s.Pending = q.Total
		s.Backfill = q.Partitions > 0
	case StartTime:
		// Exact count: one binary search per partition of the queue.
		var n int64
		it := t.iter(partPrefix(tid, q.ID))
		if it != nil {
			for it.First(); it.Valid(); it.Next() {
				pid := lastU64(it.Key())
				p, ok := t.parts[string(it.Key())]
				if !ok {
					var err error
					if p, err = decodePart(it.Value()); err != nil {
						t.corrupt(it.Key(), "partition", err)
						continue
					}
					completeTail(p, tid, pid, t.iterRange)
				}
				if p == nil {
					continue
				}
				n += int64(p.Next - t.firstAtOrAfter(tid, pid, p, ruleTime))
			}
			t.closeIter(it)
		}
		s.Pending = n
		s.Backfill = q.Partitions > 0
	}
}

// subsOf lists the subscription keys of a queue.
func (t *txn) subsOf(tid uint32, qid uint64) []string {
	pk := string(subQueuePrefix(tid, qid))
	if l, ok := t.subLists[pk]; ok {
		return l
	}
	var l []string
	it := t.iter([]byte(pk))
	if it != nil {
		for it.First(); it.Valid(); it.Next() {
			l = append(l, string(it.Key()))
		}
		t.closeIter(it)
	}
	t.subLists[pk] = l
	return l
}

// subByKey loads a subscription by its full key.
func (t *txn) subByKey(k string) *subRec {
	if s, ok := t.subs[k]; ok {
		return s
	}
	var s *subRec
	if v := t.get([]byte(k)); v != nil {
		s = &subRec{}
		if err := json.Unmarshal(v, s); err != nil {
			t.corrupt([]byte(k), "subscription", err)
			s = nil
		}
	}
	t.subs[k] = s
	return s
}

// firstAtOrAfter finds the first offset of p whose message was created at or
// after ts, by binary search over the partition's offsets.
func (t *txn) firstAtOrAfter(tid uint32, pid uint64, p *partRec, ts int64) uint64 {
	if p.Next == p.First || p.LastTime < ts {
		return p.Next
	}
	lo, hi := p.First, p.Next
	for lo < hi {
		mid := lo + (hi-lo)/2
		v := t.get(msgKey(tid, p.Queue, pid, mid))
		ct, _, ok := msgTimeIndex(v)
		if !ok || ct < ts {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// firstAfterIndex finds the first offset of p pushed by a log entry after idx.
func (t *txn) firstAfterIndex(tid uint32, pid uint64, p *partRec, idx uint64) uint64 {
	if p.Next == p.First || p.LastIdx <= idx {
		return p.Next
	}
	if p.CreatedIdx > idx {
		return p.First
	}
	lo, hi := p.First, p.Next
	for lo < hi {
		mid := lo + (hi-lo)/2
		v := t.get(msgKey(tid, p.Queue, pid, mid))
		_, mi, ok := msgTimeIndex(v)
		if !ok || mi <= idx {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// cursor loads (or computes from the start rule) a group's cursor in a
// partition. The result is cached but not marked dirty.
func (t *txn) cursor(tid uint32, s *subRec, pid uint64, p *partRec) *cursorRec {
	c, _ := t.cursorAt(tid, s, pid, p)
	return c
}

// cursorAt is cursor, and also returns the cursor's key.
func (t *txn) cursorAt(tid uint32, s *subRec, pid uint64, p *partRec) (*cursorRec, string) {
	t.keyBuf = kb(append(t.keyBuf[:0], tCursor)).u32(tid).u64(s.ID).u64(pid)
	c, ok := t.cursors[string(t.keyBuf)]
	k := ""
	// A partition created in this batch has no stored cursor: its id is
	// new, and cursors reach the batch only when it is flushed.
	if !ok && p.born != t.serial {
		k = string(t.keyBuf)
		if v := t.get(t.keyBuf); v != nil {
			var err error
			if c, err = decodeCursor(v); err != nil {
				t.corrupt([]byte(k), "cursor", err)
				c = nil
			}
		}
		t.cursors[k] = c
	}
	if k == "" && (c == nil || c.Epoch != s.Epoch || c.Cursor < p.First) {
		k = string(t.keyBuf)
	}
	if c == nil || c.Epoch != s.Epoch {
		c = &cursorRec{Epoch: s.Epoch}
		switch s.Rule {
		case StartAll:
			c.Cursor = p.First
		case StartIndex:
			c.Cursor = t.firstAfterIndex(tid, pid, p, s.RuleIndex)
		case StartTime:
			c.Cursor = t.firstAtOrAfter(tid, pid, p, s.RuleTime)
		}
		t.cursors[k] = c
		t.dirty[k] = c
	}
	if c.Cursor < p.First {
		c.Cursor = p.First
		c.normalize()
		t.dirty[k] = c
	}
	return c, k
}

// setReady puts (group, partition) in the ready index unless it is there.
func (t *txn) setReady(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	if !c.Ready {
		t.setReadyAt(tid, s, pid, c, string(cursorKey(tid, s.ID, pid)))
	}
}

// setReadyAt is setReady for a cursor whose key (ck) the caller may have
// ("": not yet).
func (t *txn) setReadyAt(tid uint32, s *subRec, pid uint64, c *cursorRec, ck string) {
	if c.Ready {
		return
	}
	if ck == "" {
		ck = string(cursorKey(tid, s.ID, pid))
	}
	t.scratch = kb(append(t.scratch[:0], tReady)).u32(tid).u64(s.ID).u64(pid)
	t.set(t.scratch, nil)
	if r := t.ready[subRef{tid, s.ID}]; r != nil {
		r.ReplaceOrInsert(pid)
	}
	c.Ready = true
	t.dirty[ck] = c
}

// clearReady takes (group, partition) out of the ready index.
func (t *txn) clearReady(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	if !c.Ready {
		return
	}
	t.delReady(tid, s.ID, pid)
	c.Ready = false
	t.markCursor(tid, s, pid, c)
}

// delReady deletes one ready key and its mirror entry.
func (t *txn) delReady(tid uint32, sub, pid uint64) {
	t.del(readyKey(tid, sub, pid))
	if r := t.ready[subRef{tid, sub}]; r != nil {
		r.Delete(pid)
	}
}

// dropReady deletes a subscription's whole ready index.
func (t *txn) dropReady(tid uint32, sub uint64) {
	t.delRange(readySubPrefix(tid, sub))
	delete(t.ready, subRef{tid, sub})
}

// readyOf returns the in-memory mirror of a subscription's ready index,
// loading it from the batch (which sees this batch's writes) on first use.
func (t *txn) readyOf(tid uint32, sub uint64) *readySet {
	k := subRef{tid, sub}
	if r := t.ready[k]; r != nil {
		return r
	}
	r := newReadySet()
	if it := t.iter(readySubPrefix(tid, sub)); it != nil {
		for ok := it.First(); ok; ok = it.Next() {
			r.ReplaceOrInsert(lastU64(it.Key()))
		}
		t.closeIter(it)
	}
	t.ready[k] = r
	return r
}

func (t *txn) markCursor(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	t.dirty[string(cursorKey(tid, s.ID, pid))] = c
}

// hasWork reports whether the group has deliverable-in-principle messages in
// the partition (ignoring leases and visibility times).
func hasWork(c *cursorRec, p *partRec) bool {
	if c.Cursor < p.Next {
		return true
	}
	for _, x := range c.Ex {
		if x.Flags&exRequeued != 0 && x.Flags&exDone == 0 {
			return true
		}
	}
	return false
}

func (t *txn) tenantNameOf(tid uint32) string {
	if name, ok := t.newTenants[tid]; ok {
		return name
	}
	return t.s.tenantName(tid)
}

func (t *txn) wake(tid uint32, queue string) {
	name, ok := t.newTenants[tid]
	if !ok {
		name = t.s.tenantName(tid)
	}
	t.woken[Wake{Tenant: name, Queue: queue}] = struct{}{}
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

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
