package state

import "cmp"

// cursor loads (or computes from the start rule) a group's cursor in a
// partition. The result is cached but not marked dirty.
func (ac *applyCtx) cursor(tid uint32, s *subRec, pid uint64, p *partRec) *cursorRec {
	c, _ := ac.cursorAt(tid, s, pid, p)
	return c
}

// cursorAt is cursor, and also returns the cursor's key when it marked the
// cursor changed ("" otherwise; setReadyAt no longer needs it).
//
// A cursor that the start rule gives (derived) is not written: a missing
// or older-epoch record stands for it, and whoever loads it computes it
// again, the same way, from the rule and the partition's messages (which
// never change; retention only moves First, and the cursor is raised to
// First either way). Its Ready flag is then whether the ready key exists.
// It is written once something else changes it (markCursor). So a push
// into a new partition writes the ready key and no cursor record, and does
// not cache the cursor either: whoever needs it next derives it again
// without a read (partRec.noCursor).
func (ac *applyCtx) cursorAt(tid uint32, s *subRec, pid uint64, p *partRec) (*cursorRec, string) {
	return ac.cursorFor(tid, s, pid, p, false)
}

// cursorFor is cursorAt; with transient, the caller keeps a derived cursor
// that is not cached only until its next call (a push's look at a
// partition's readiness), so such a cursor is built in a scratch record
// instead of a new one: over a million partitions a push derives one per
// message, each an allocation the collector had to sweep.
func (ac *applyCtx) cursorFor(tid uint32, s *subRec, pid uint64, p *partRec, transient bool) (*cursorRec, string) {
	ref := curRef(tid, s.ID, pid)
	var c *cursorRec
	ok := false
	if !p.uncursored {
		if c, ok = ac.cursors[ref]; !ok {
			c, ok = ac.unsettle(ref)
		}
	}
	if !ok && !p.noCursor {
		ac.keyBuf = kb(append(ac.keyBuf[:0], tCursor)).u32(tid).u64(s.ID).u64(pid)
		if v := ac.get(ac.keyBuf); v != nil {
			var err error
			if c, err = decodeCursor(v); err != nil {
				ac.corrupt(append([]byte(nil), ac.keyBuf...), "cursor", err)
				c = nil
			}
		}
		if c != nil && c.Epoch == s.Epoch {
			ac.overlay(tid, s, pid, c)
		}
		ac.cursors[ref] = c
	}
	if c == nil || c.Epoch != s.Epoch {
		if p.uncursored {
			// The push that created the partition looks at the cursor
			// once and keeps nothing of it: a scratch record serves.
			ac.freshCur = cursorRec{}
			c = &ac.freshCur
		} else if transient {
			ac.peekCur = cursorRec{}
			c = &ac.peekCur
		} else {
			c = &cursorRec{}
		}
		c.Epoch, c.derived = s.Epoch, true
		switch s.Rule {
		case StartAll:
			c.Cursor = p.First
		case StartIndex:
			c.Cursor = ac.firstAfterIndex(tid, pid, p, s.RuleIndex)
		case StartTime:
			c.Cursor = ac.firstAtOrAfter(tid, pid, p, s.RuleTime)
		}
		if p.uncursored {
			// The push that created the partition: no ready key yet, and
			// nothing to cache.
			return c, ""
		}
		c.Ready = ac.isReady(tid, s.ID, pid, p.Queue)
		// No record of the group's epoch: a pop may have leased the
		// partition without writing one.
		ac.overlay(tid, s, pid, c)
		if !p.noCursor || s.Rule != StartAll || c.unwritten {
			if c == &ac.peekCur {
				c = new(cursorRec)
				*c = ac.peekCur
			}
			// Cached until the batch ends, then settled (flush).
			ac.cursors[ref] = c
			ac.promoted = append(ac.promoted, ref)
		}
		// Otherwise the derived cursor is not cached: deriving it again
		// takes no read (Cursor from p.First, Ready from the mirror or
		// the ready key), and over a million partitions a cached derived
		// cursor per partition a push touched was a map entry and a heap
		// object each, for the collector to scan (docs/design/state.md,
		// "A pop over many partitions"). markCursor caches it once it
		// changes.
	}
	k := ""
	if c.Cursor < p.First {
		c.Cursor = p.First
		c.normalize()
		if !c.derived {
			k = string(cursorKey(tid, s.ID, pid))
			ac.dirtyCur[ref] = c
		}
	}
	return c, k
}

// cursorRef names a cursor in the cache: a number key, where the cursor's
// Pebble key as a string would be one more object per cached cursor.
// The tenant id is widened so that the struct has no padding: a key of
// plain memory is hashed and compared in one piece, not field by field
// (a million cached cursors are looked up in this map).
type cursorRef struct {
	tid      uint64
	sub, pid uint64
}

func curRef(tid uint32, sub, pid uint64) cursorRef { return cursorRef{uint64(tid), sub, pid} }

// cmpCursorRef orders cursors as their keys sort.
func cmpCursorRef(a, b cursorRef) int {
	if c := cmp.Compare(a.tid, b.tid); c != 0 {
		return c
	}
	if c := cmp.Compare(a.sub, b.sub); c != 0 {
		return c
	}
	return cmp.Compare(a.pid, b.pid)
}

// isReady reports whether the ready index holds (group, partition) of
// queue qid: from the group's mirror if it is loaded, else with one read.
// Once a group has paid for as many reads as loading its mirror would cost
// (readyMirrorAfter), the mirror is loaded and answers from then on.
func (ac *applyCtx) isReady(tid uint32, sub, pid, qid uint64) bool {
	ref := subRef{tid, sub}
	if r := ac.ready[ref]; r != nil {
		return r.Has(pid)
	}
	n := ac.readyReads[ref] + 1
	if q := ac.queue(tid, qid); q != nil && q.Partitions <= maxMirroredPartitions && n > readyMirrorAfter(q.Partitions) {
		delete(ac.readyReads, ref)
		return ac.readyOf(tid, sub).Has(pid)
	}
	ac.readyReads[ref] = n
	return ac.has(readyKey(tid, sub, pid))
}

// A group's ready mirror is loaded by a push once it has read this many of
// the group's ready keys one by one: a point read costs about a hundred
// times what one key of the loading scan costs (7 µs against 50 ns in a
// profile of pushes into a million partitions just written), so by then
// the reads have cost about as much as the scan, and the scan holds at
// most one key per partition. Queues with more partitions than maxMirroredPartitions keep
// reading (their mirror would take more memory than the budget spares);
// pops still load the mirror of a group they serve.
func readyMirrorAfter(partitions int64) int {
	return int(max(partitions/128, 256))
}

const maxMirroredPartitions = 4 << 20

// setReady puts (group, partition) in the ready index unless it is there.
func (ac *applyCtx) setReady(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	if !c.Ready {
		ac.setReadyAt(tid, s, pid, c, "")
	}
}

// setReadyAt is setReady; ck, the cursor's key that cursorAt returns, is
// no longer needed (changed cursors are noted by number, dirtyCur) and is
// ignored. A derived cursor stays unwritten: its Ready flag is the ready
// key.
func (ac *applyCtx) setReadyAt(tid uint32, s *subRec, pid uint64, c *cursorRec, ck string) {
	if c.Ready {
		return
	}
	ac.scratch = kb(append(ac.scratch[:0], tReady)).u32(tid).u64(s.ID).u64(pid)
	ac.set(ac.scratch, nil)
	if r := ac.ready[subRef{tid, s.ID}]; r != nil {
		r.Insert(pid)
	}
	c.Ready = true
	if c.derived {
		return
	}
	ac.dirtyCur[curRef(tid, s.ID, pid)] = c
}

// clearReady takes (group, partition) out of the ready index.
func (ac *applyCtx) clearReady(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	if !c.Ready {
		return
	}
	ac.delReady(tid, s.ID, pid)
	c.Ready = false
	if !c.derived {
		ac.markCursor(tid, s, pid, c)
	}
}

// delReady deletes one ready key and its mirror entry.
func (ac *applyCtx) delReady(tid uint32, sub, pid uint64) {
	ac.del(readyKey(tid, sub, pid))
	if r := ac.ready[subRef{tid, sub}]; r != nil {
		r.Delete(pid)
	}
}

// dropReady deletes a subscription's whole ready index.
func (ac *applyCtx) dropReady(tid uint32, sub uint64) {
	ac.delRange(readySubPrefix(tid, sub))
	delete(ac.ready, subRef{tid, sub})
}

// readyOf returns the in-memory mirror of a subscription's ready index,
// loading it from the batch (which sees this batch's writes) on first use.
func (ac *applyCtx) readyOf(tid uint32, sub uint64) *readySet {
	k := subRef{tid, sub}
	if r := ac.ready[k]; r != nil {
		return r
	}
	r := newReadySet()
	if it := ac.iter(readySubPrefix(tid, sub)); it != nil {
		for ok := it.First(); ok; ok = it.Next() {
			r.Insert(lastU64(it.Key()))
		}
		ac.closeIter(it)
	}
	ac.ready[k] = r
	return r
}

// markCursor records a change of a cursor: from now on it is written.
func (ac *applyCtx) markCursor(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	c.derived = false
	if p, _ := ac.parts.get(pid); p != nil {
		p.noCursor = false
	}
	ref := curRef(tid, s.ID, pid)
	ac.cursors[ref] = c // a derived cursor may not be cached (cursorAt)
	ac.dirtyCur[ref] = c
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

// settledCur is a cached cursor with nothing in flight: no exceptions and
// no lease, which is what its record then holds besides these fields (a
// cursor decoded from such a record is exactly {Epoch, Cursor, Ready,
// Stamp}).
// Over a million partitions most of a group's cursors are settled between
// its pops; kept as plain values (settledSet, no pointers), the collector
// does not scan them, where a *cursorRec per partition (and the lease's
// transaction ids it kept) was an object or three each to mark at every
// cycle (docs/design/state.md, "A pop over many partitions").
//
// A derived cursor (see cursorAt) is settled too, with derived set: it is
// cached so that a partition whose records say nothing of the group needs
// no read to say so again.
type settledCur struct {
	epoch, cursor, stamp uint64
	ready, derived, set  bool // set: an entry (settledSet)
}

// settle moves cursor ref, if cached and settled, from cursors into
// settled. It runs when the batch ends (flush): what a batch changes is a
// *cursorRec while the batch runs.
func (ac *applyCtx) settle(ref cursorRef) {
	c := ac.cursors[ref]
	if c == nil || len(c.Ex) != 0 || c.LeaseExpires != 0 || len(c.LeaseOffs) != 0 {
		return
	}
	delete(ac.cursors, ref)
	ac.settled.put(ref, settledCur{epoch: c.Epoch, cursor: c.Cursor, stamp: c.Stamp, ready: c.Ready, derived: c.derived})
	ac.settled.release(c)
}

// unsettle takes cursor ref back from settled into cursors, as the record
// it stands for decodes, and notes it for flush to settle again.
func (ac *applyCtx) unsettle(ref cursorRef) (*cursorRec, bool) {
	sc, ok := ac.settled.get(ref)
	if !ok {
		return nil, false
	}
	ac.settled.del(ref)
	c := ac.settled.record(sc)
	ac.cursors[ref] = c
	ac.promoted = append(ac.promoted, ref)
	return c, true
}

func (ac *applyCtx) isSettled(ref cursorRef) bool {
	_, ok := ac.settled.get(ref)
	return ok
}
