package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/cockroachdb/pebble/v2"
)

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
	inBytes := entryBytes(entries)
	ac := s.newApplyCtx(s.sizer.size(inBytes))
	handedOff := false
	defer func() {
		if !handedOff {
			ac.b.Close()
			// Cached records may hold changes that were never committed.
			s.cache = newRecordCache()
		}
	}()
	out := make([][]any, len(entries))
	for i, le := range entries {
		if le.Index <= ac.m.Applied {
			continue
		}
		ac.m.Applied = le.Index
		ac.index = le.Index
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
		ac.now = en.Time
		if ac.now < ac.m.LastTime {
			ac.now = ac.m.LastTime
		}
		ac.m.LastTime = ac.now
		res := make([]any, len(en.Cmds))
		for j, c := range en.Cmds {
			ac.cmdNo = uint64(j)
			res[j] = ac.apply(c)
			ac.closeLocator()
			if ac.err != nil {
				s.halt(ac.err)
				return nil, ac.err
			}
		}
		out[i] = res
	}
	// Dirty records are written once per batch. Records that iterations
	// must see within the batch (new partitions, subscriptions) are also
	// written through when created; every other read goes through the
	// caches, which hold the newest value.
	if err := ac.flush(); err != nil {
		e := &ApplyError{Index: ac.m.Applied, Op: "write the batch", Err: err}
		s.halt(e)
		return nil, e
	}
	mb, err := json.Marshal(&ac.m)
	if err != nil {
		return nil, fmt.Errorf("encode meta: %w", err)
	}
	if err := ac.b.Set(metaKey, mb, nil); err != nil {
		e := &ApplyError{Index: ac.m.Applied, Key: metaKey, Op: "write", Err: err}
		s.halt(e)
		return nil, e
	}
	s.sizer.learn(inBytes, ac.b.Len())
	// The results are final: the entries are durable in the Raft log, and
	// applying them again after a crash gives the same results. So a large
	// batch goes into Pebble's memtable (half of the apply time) while the
	// caller hands out the results; the next batch, a checkpoint, a reader
	// and Close wait for it. AppliedIndex moves only once it is in. A small
	// batch is committed here: starting and waking a goroutine costs more
	// than its insert.
	handedOff = true
	p := &pendingCommit{done: make(chan struct{})}
	s.pending.Store(p)
	s.meta = ac.m
	s.lastTime.Store(ac.m.LastTime)
	if len(ac.newTenants) > 0 {
		s.tenantsMu.Lock()
		for id, name := range ac.newTenants {
			s.tenantNames[id] = name
		}
		s.tenantsMu.Unlock()
	}
	if len(ac.encChanged) > 0 {
		s.encMu.Lock()
		for k, on := range ac.encChanged {
			if on {
				s.encQueues[k] = true
			} else {
				delete(s.encQueues, k)
			}
		}
		s.encMu.Unlock()
	}
	if ac.b.Len() < inlineCommitBytes {
		s.commit(ac, p)
	} else {
		go s.commit(ac, p)
	}
	return out, nil
}

// inlineCommitBytes is the batch size below which ApplyBatch commits the
// batch itself instead of handing it to a goroutine. Below it, the
// goroutine's start and wake-up cost more than the insert they would
// overlap (docs/benchmarks.md, "Session 27: small batches committed in
// line"); above it, the insert takes a millisecond or more.
const inlineCommitBytes = 256 << 10

// commit writes an applied batch into Pebble and then publishes it: the
// applied index, the next deadline, and the queues with new work.
func (s *Store) commit(ac *applyCtx, p *pendingCommit) {
	defer close(p.done)
	s.batchBytes.Add(uint64(ac.b.Len()))
	err := ac.b.Commit(pebble.NoSync)
	ac.b.Close()
	if err != nil {
		// The state can no longer follow the log. The entries are in the
		// Raft log, and a restart applies them again; the applied index
		// stays where it was.
		s.halt(&ApplyError{Index: ac.m.Applied, Op: "commit the batch ending at this entry", Err: err})
		return
	}
	s.applied.Store(ac.m.Applied)
	if s.onApplied != nil {
		s.onApplied()
	}
	switch {
	case ac.ticked:
		s.refreshDeadline()
	case ac.schedMin != 0:
		// Only lower it here; removals can leave it early, which costs one
		// Tick that finds nothing and recomputes it exactly.
		if d := s.deadline.Load(); d == 0 || ac.schedMin < d {
			s.deadline.Store(ac.schedMin)
		}
	}
	if s.onWake != nil && len(ac.woken) > 0 {
		w := make([]Wake, 0, len(ac.woken))
		at := make([]uint64, 0, len(ac.woken))
		for k, pos := range ac.woken {
			w = append(w, k)
			at = append(at, pos)
		}
		s.onWake(w, at)
	}
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

// applyCtx is the working state of one ApplyBatch: the Pebble batch, the
// working meta record and decoded-record caches. Mutated records are marked
// dirty and written at the end of the batch, in sorted key order.
type applyCtx struct {
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
	// freshCur is the derived cursor of a partition that the running push
	// created, which it looks at once (cursorAt).
	freshCur cursorRec
	// peekCur is the derived cursor a push looked at last and did not
	// cache (cursorFor with transient).
	peekCur cursorRec

	tenants    map[string]uint32
	newTenants map[uint32]string
	queues     map[string]*queueRec // by queue key
	queueNames map[string]uint64    // by queue-name key; 0 = absent
	partIDs    *nameIndex           // by partition-name key's hash (partIDIn)
	partLocs   map[uint64]partLoc   // partition id -> tenant and queue
	locRuns    *locRuns
	parts      *partCache          // by partition id
	subs       map[string]*subRec  // by sub key; nil = absent
	subLists   map[string][]string // sub keys by sub-queue prefix
	cursors    map[cursorRef]*cursorRec
	settled    *settledSet
	// promoted lists the settled cursors this batch took back into
	// cursors (cursorAt); flush settles them again.
	promoted   []cursorRef
	ready      map[subRef]*readySet
	readyReads map[subRef]int
	filters    map[queueRef]*nameFilter
	lastFilter filterMemo
	leases     map[leaseRef]*leaseRec // lease records (lease_index.go); nil = absent
	lidx       *overlayIndex          // (group, partition) -> overlay (lease_overlay.go)
	dirty      map[string]any
	// dirtyCur holds the changed cursors, by number: a cursor's key as a
	// string would be an allocation per change (flush writes them after
	// the records of dirty, whose tables sort before the cursors').
	dirtyCur map[cursorRef]*cursorRec
	// capCur holds cursors as they were when a pop that did not write
	// them began (captureCursor), for the flush to write unless dirtyCur
	// holds them again; their encodings are in capBuf.
	capCur map[cursorRef][]byte
	capBuf []byte
	// leaseDirty lists the lease records the running command added to.
	leaseDirty []leaseRef
	// loc is the running command's open locator run (noteLocator).
	loc locRun

	woken          map[Wake]uint64 // the position of the last change that woke it
	encChanged     map[string]bool
	schedMin       int64 // earliest time scheduled by this batch
	ticked         bool  // a Tick ran: recompute the deadline exactly
	backfillRounds int
	err            *ApplyError // the first storage error (fault.go)
}

func (s *Store) newApplyCtx(batchSize int) *applyCtx {
	c := s.cache
	s.batches++
	return &applyCtx{
		s:          s,
		serial:     s.batches,
		b:          s.newBatch(batchSize),
		m:          s.meta,
		tenants:    c.tenants,
		newTenants: map[uint32]string{},
		queues:     c.queues,
		queueNames: c.queueNames,
		partIDs:    c.partIDs,
		partLocs:   c.partLocs,
		locRuns:    c.locRuns,
		parts:      c.parts,
		subs:       c.subs,
		subLists:   c.subLists,
		cursors:    c.cursors,
		settled:    c.settled,
		ready:      c.ready,
		readyReads: c.readyReads,
		filters:    c.filters,
		leases:     c.leases,
		lidx:       c.leaseIdx,
		dirty:      map[string]any{},
		dirtyCur:   map[cursorRef]*cursorRec{},
		capCur:     map[cursorRef][]byte{},
		woken:      map[Wake]uint64{},
		encChanged: map[string]bool{},
	}
}

// schedule notes a time written to a time-ordered index.
func (ac *applyCtx) schedule(at int64) {
	if ac.schedMin == 0 || at < ac.schedMin {
		ac.schedMin = at
	}
}

// seq orders commands: the log index and the command's place in its entry.
// Messages record it, "new" subscriptions start after a seq, and wakes and
// pop results carry it (Position).
func (ac *applyCtx) seq() uint64 { return ac.index<<20 | ac.cmdNo&(1<<20-1) }

// Position is the position (seq) of the first command of the log entry at
// index: every command of the entries before it is at a lower position.
func Position(index uint64) uint64 { return index << 20 }

func (ac *applyCtx) apply(c Command) any {
	switch c := c.(type) {
	case *Push:
		return ac.push(c)
	case *Pop:
		return ac.pop(c)
	case *Ack:
		return ac.ack(c)
	case *ExtendLease:
		return ac.extend(c)
	case *Configure:
		return ac.configure(c)
	case *DeleteQueue:
		return ac.deleteQueue(c)
	case *Seek:
		return ac.seek(c)
	case *DeleteGroup:
		return ac.deleteGroup(c)
	case *DLQRequeue:
		return ac.dlqRequeue(c)
	case *DLQDelete:
		return ac.dlqDelete(c)
	case *Tick:
		ac.ticked = true
		return ac.tick()
	case *Txn:
		return ac.applyTxn(c)
	}
	return &CountResult{Err: &Error{Code: "unknown_command", Message: fmt.Sprintf("unknown command %T", c)}}
}

// flush writes dirty records in key order.
func (ac *applyCtx) flush() error {
	// Once the dirty cursors are written, the cursors the batch read
	// from settled go back there too (settle releases their records).
	defer func() {
		for _, ref := range ac.promoted {
			ac.settle(ref)
		}
		ac.promoted = ac.promoted[:0]
	}()
	if len(ac.dirty) == 0 && len(ac.dirtyCur) == 0 && len(ac.capCur) == 0 {
		return nil
	}
	keys := make([]string, 0, len(ac.dirty))
	for k := range ac.dirty {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Cursors go in key order among the other records: their table byte
	// sorts after every record table dirty holds, but the split is found
	// rather than assumed.
	split := sort.Search(len(keys), func(i int) bool { return keys[i] >= string([]byte{tCursor}) })
	var kbuf []byte
	for _, k := range keys[:split] {
		if err := ac.flushRecord(k, &kbuf); err != nil {
			return err
		}
	}
	if len(ac.dirtyCur) > 0 || len(ac.capCur) > 0 {
		refs := make([]cursorRef, 0, len(ac.dirtyCur)+len(ac.capCur))
		for ref := range ac.dirtyCur {
			refs = append(refs, ref)
		}
		for ref := range ac.capCur {
			if _, ok := ac.dirtyCur[ref]; !ok {
				refs = append(refs, ref)
			}
		}
		slices.SortFunc(refs, cmpCursorRef)
		for _, ref := range refs {
			v, captured := ac.capCur[ref]
			c, dirty := ac.dirtyCur[ref]
			if dirty {
				ac.scratch = c.appendTo(ac.scratch[:0])
				v = ac.scratch
				c.unwritten = false
			} else if !captured {
				continue
			}
			kbuf = kb(append(kbuf[:0], tCursor)).u32(uint32(ref.tid)).u64(ref.sub).u64(ref.pid)
			if err := ac.b.Set(kbuf, v, nil); err != nil {
				return fmt.Errorf("flush %x: %w", kbuf, err)
			}
			if dirty {
				ac.settle(ref)
			}
		}
		clear(ac.dirtyCur)
		clear(ac.capCur)
	}
	for _, k := range keys[split:] {
		if err := ac.flushRecord(k, &kbuf); err != nil {
			return err
		}
	}
	clear(ac.dirty)
	return nil
}

// flushRecord writes the dirty record of key k.
func (ac *applyCtx) flushRecord(k string, kbuf *[]byte) error {
	var v []byte
	switch r := ac.dirty[k].(type) {
	case *queueRec:
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode queue %s: %w", r.Name, err)
		}
		v = b
	case *partRec:
		// The batch copies the value: one buffer serves every record.
		ac.scratch = r.appendTo(ac.scratch[:0])
		v = ac.scratch
	case *subRec:
		ac.scratch = r.appendTo(ac.scratch[:0])
		v = ac.scratch
	case *cursorRec:
		ac.scratch = r.appendTo(ac.scratch[:0])
		v = ac.scratch
	default:
		return fmt.Errorf("flush: unexpected record %T", r)
	}
	*kbuf = append((*kbuf)[:0], k...)
	if err := ac.b.Set(*kbuf, v, nil); err != nil {
		return fmt.Errorf("flush %x: %w", k, err)
	}
	return nil
}

func (ac *applyCtx) wake(tid uint32, queue string) {
	name, ok := ac.newTenants[tid]
	if !ok {
		name = ac.s.tenantName(tid)
	}
	ac.woken[Wake{Tenant: name, Queue: queue}] = ac.seq()
}
