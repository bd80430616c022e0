package state

import (
	"bytes"
	"slices"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// backfillScan bounds how many partition records one pop inspects while a
// group created "from the start" looks for existing partitions with work.
const backfillScan = 512

// backfillMinFind is the fewest partitions with work a backfill round looks
// for, however few the pop can claim: a round opens two iterators and
// seeks them, so a pop of one partition leaves the others it found in the
// ready index for the next pops, as every round did before rounds stopped
// at what the pop can claim.
const backfillMinFind = 64

func parseLeaseID(s string) ([16]byte, bool) {
	u, err := uuid.Parse(s)
	if err != nil {
		return [16]byte{}, false
	}
	return [16]byte(u), true
}

// subFor finds or creates the subscription a pop reads through.
func (ac *applyCtx) subFor(tid uint32, q *queueRec, c *Pop) *subRec {
	group := c.Group
	if group == "" {
		group = QueueModeGroup
	}
	if s := ac.sub(tid, q.ID, group); s != nil {
		return s
	}
	switch {
	case c.SubFromNow:
		return ac.createSub(tid, q, group, StartIndex, ac.seq(), 0)
	case c.SubFrom != 0:
		return ac.createSub(tid, q, group, StartTime, 0, c.SubFrom)
	case c.SubMode == "all":
		return ac.createSub(tid, q, group, StartAll, 0, 0)
	default:
		return ac.createSub(tid, q, group, StartIndex, ac.seq(), 0)
	}
}

func (ac *applyCtx) pop(c *Pop) *PopResult {
	res := &PopResult{LeaseID: c.LeaseID, At: ac.seq()}
	if c.AutoAck {
		res.LeaseID = ""
	}
	// A pop creates the queue (as a push would) and the group: a consumer
	// that starts before any producer must see the first message, and a
	// "new" group starts at the end of the queue as it is now (empty).
	tid, _ := ac.tenantID(c.Tenant, true)
	q := ac.queueByName(tid, c.Queue)
	if q == nil {
		q = ac.createQueue(tid, c.Queue)
	}
	res.QueueExists = true
	res.tid, res.qid = tid, q.ID
	s := ac.subFor(tid, q, c)
	ac.markSub(tid, q.ID, s)
	lease, okLease := parseLeaseID(c.LeaseID)
	if !okLease && !c.AutoAck {
		res.Err = &Error{Code: "invalid_parameter", Message: "lease id is not a UUID"}
		return res
	}
	leaseSecs := c.LeaseSeconds
	if leaseSecs <= 0 {
		leaseSecs = q.Options.LeaseTime
	}
	if leaseSecs <= 0 {
		leaseSecs = 300
	}
	remaining := c.Batch
	if remaining <= 0 {
		remaining = 1
	}
	maxParts := c.Partitions
	if maxParts <= 0 {
		maxParts = 1
	}
	// The deliveries gather in the store's kept slice; fit gives the
	// result a copy of their own size (a long poll asking for 100 and
	// getting one message took a slice of 100 from the heap per pop).
	res.Messages = ac.s.popMsgs[:0]
	ac.s.popMsgs = nil
	if cap(res.Messages) < min(remaining, popMsgsKept) {
		res.Messages = make([]Delivered, 0, min(remaining, popMsgsKept))
	}
	var sc popScratch
	defer sc.close(ac)
	defer ac.flushLeases()
	defer sc.fit(ac.s, res)
	claim := func(pid uint64) {
		defer func() { sc.unready = false }()
		p := ac.part(tid, q.ID, pid)
		if p == nil {
			ac.delReady(tid, s.ID, pid)
			return
		}
		before := len(res.Messages)
		res.Messages = ac.deliver(res.Messages, &sc, tid, q, s, pid, p, remaining, c.AutoAck, lease, leaseSecs)
		if n := len(res.Messages) - before; n > 0 {
			res.Claimed++
			remaining -= n
		}
	}
	if c.Partition != nil {
		if pid := ac.partIDByName(tid, q.ID, *c.Partition); pid != 0 {
			claim(pid)
		}
		return res
	}
	// Round robin over the ready index, starting after the last partition
	// this group was served from.
	tried := map[uint64]bool{}
	ready := ac.readyOf(tid, s.ID)
	for pass := 0; pass < 2 && remaining > 0 && res.Claimed < maxParts; pass++ {
		lo := s.ScanPos
		if pass == 1 {
			lo = 0
		}
		// Collect a few more than needed: some may turn out blocked.
		want := 4*(maxParts-res.Claimed) + 8
		var pids []uint64
		ready.AscendGreaterOrEqual(lo, func(pid uint64) bool {
			if !tried[pid] {
				pids = append(pids, pid)
			}
			return len(pids) < want
		})
		for _, pid := range pids {
			if remaining <= 0 || res.Claimed >= maxParts {
				break
			}
			tried[pid] = true
			claim(pid)
			s.ScanPos = pid + 1
		}
	}
	// A group reading from the start looks for existing partitions with work.
	ac.backfillRounds = 0
	for s.Backfill && remaining > 0 && res.Claimed < maxParts && ac.backfillRounds < 8 {
		// The partitions found are not in the ready index yet: those this
		// pop claims go in only if they are still ready after it (it
		// leases most of them), the others at once.
		for _, pid := range ac.backfill(tid, q, s, max(min(remaining, maxParts-res.Claimed), backfillMinFind)) {
			if remaining <= 0 || res.Claimed >= maxParts || tried[pid] {
				if p := ac.part(tid, q.ID, pid); p != nil {
					ac.setReady(tid, s, pid, ac.cursor(tid, s, pid, p))
				}
				continue
			}
			tried[pid] = true
			sc.unready = true
			claim(pid)
		}
	}
	res.Drained = ready.Len() == 0 && !s.Backfill
	return res
}

// backfill scans the next partition records of a group that reads from the
// start and returns those with work, for the caller to claim or mark ready.
// It stops once it has found want of them (about the most the pop can
// claim): a partition found beyond those goes into the ready index only
// for the next pop to take it out again, two writes where the next pop's
// scan finds it with none.
//
// The queue's records are taken in id order from the record cache while it
// holds the next ids (a record, another queue's, or "absent"): over many
// partitions a step of an iterator over the records, which the pushes
// rewrite, merges every memtable and level and costs about as much as the
// rest of the scan. The others come from an iterator over the queue's
// records, opened at the first of them and stepped or sought forward.
// Either way the next record is the same, so what a round finds does not
// depend on what is cached (replicas apply it alike).
func (ac *applyCtx) backfill(tid uint32, q *queueRec, s *subRec, want int) []uint64 {
	ac.backfillRounds++
	var found []uint64
	var it, curs *pebble.Iterator
	itOK, curOK, failed := false, false, false
	defer func() {
		if curs != nil {
			ac.closeIter(curs)
		}
		if it != nil {
			ac.closeIter(it)
		}
	}()
	// next returns the queue's first record at or after id pos.
	next := func(pos uint64) (uint64, *partRec, bool) {
		for gap := 0; pos < ac.m.NextPart && gap < backfillCacheGap; pos, gap = pos+1, gap+1 {
			p, cached := ac.parts.get(pos)
			if !cached {
				break
			}
			if p != nil && p.tid == tid && p.Queue == q.ID {
				return pos, p, true
			}
		}
		k := partKey(tid, q.ID, pos)
		switch {
		case it == nil:
			if it = ac.iterRange(k, prefixEnd(partPrefix(tid, q.ID))); it == nil {
				failed = true
				return 0, nil, false
			}
			itOK = it.First()
		case itOK && bytes.Compare(it.Key(), k) < 0:
			// Step over the records walked in the cache since, unless
			// they are many.
			for steps := 0; itOK && bytes.Compare(it.Key(), k) < 0; steps++ {
				if steps == 8 {
					itOK = it.SeekGE(k)
					break
				}
				itOK = it.Next()
			}
		}
		if !itOK {
			return 0, nil, false
		}
		pid := lastU64(it.Key())
		p, cached := ac.parts.get(pid)
		if !cached {
			var err error
			if p, err = decodePart(it.Value()); err != nil {
				ac.corrupt(it.Key(), "partition", err)
				p = nil
			} else {
				completeTail(p, tid, pid, ac.iterRange)
			}
			ac.cachePart(tid, pid, p)
		}
		return pid, p, true
	}
	n := 0
	pid, p, ok := next(s.BackfillPos)
	for ; ok && n < backfillScan && len(found) < want; pid, p, ok = next(pid + 1) {
		n++
		s.BackfillPos = pid + 1
		if p == nil {
			continue // not decoded (reported)
		}
		ref := curRef(tid, s.ID, pid)
		if _, known := ac.cursors[ref]; !known && !p.noCursor && !ac.isSettled(ref) {
			// The group's cursors of these partitions are read with one
			// iterator walked beside the ids, instead of a point read
			// each: a group that is new to a queue has none, and a point
			// read of a key that is not there searches every memtable and
			// level. (A partition without cursor records, noCursor, needs
			// neither: its cursor is derived.)
			if curs == nil {
				if curs = ac.iterRange(cursorKey(tid, s.ID, pid), prefixEnd(cursorSubPrefix(tid, s.ID))); curs == nil {
					return nil
				}
				curOK = curs.First()
			}
			for curOK && lastU64(curs.Key()) < pid {
				curOK = curs.Next()
			}
			var c *cursorRec
			if curOK && lastU64(curs.Key()) == pid {
				var err error
				if c, err = decodeCursor(curs.Value()); err != nil {
					ac.corrupt(curs.Key(), "cursor", err)
					c = nil
				}
			}
			if c != nil && c.Epoch == s.Epoch {
				ac.overlay(tid, s, pid, c)
			}
			ac.cursors[ref] = c
		}
		cur := ac.cursor(tid, s, pid, p)
		if !cur.leased(ac.now) && hasWork(cur, p) {
			found = append(found, pid)
		}
	}
	if failed {
		s.Backfill = false
		return nil
	}
	if !ok {
		s.Backfill = false
	}
	ac.markSub(tid, q.ID, s)
	return found
}

// backfillCacheGap bounds the ids of other queues (or of no partition) the
// backfill walks in the record cache before it asks its iterator, which
// seeks past them.
const backfillCacheGap = 64

// popScratch is what the partitions of one pop share: the arena of their
// messages, and one iterator over the queue's message keys (cheaper than
// opening one per partition). Partitions are mostly claimed in id order,
// and the iterator is only ever sought forward from where it stopped, so
// Pebble can often step to the next partition's messages instead of seeking
// from the top of every level. A pop writes no message keys, so the
// iterator's view of the batch, taken when it is opened, stays right for
// the whole pop.
type popScratch struct {
	arena msgArena
	it    *pebble.Iterator
	hi    []byte // the end of the current partition's range
	// atLast says the iterator stopped on the only message of the
	// partition claimed before, one with no dedup key after it (its id is
	// in the partition record), so the next key is the next partition's
	// first: one step may find the range of the partition claimed next.
	atLast bool
	// endPid is the partition on whose last message the iterator stopped
	// (0: it did not stop on one), and stepped says the iterator's last
	// move was a step (Next): a seek after a step positions every level
	// of the LSM from the top, where a seek after a seek may be served by
	// stepping, so from there a few steps are tried first when the
	// partition claimed next is endPid+1 (only endPid's dedup keys lie
	// between).
	endPid  uint64
	stepped bool
	// unready says the partition being claimed is ready though not in
	// the ready index: a backfill found it. Its key is written only if
	// the partition is still ready once delivered from.
	unready bool
}

// messages positions the shared iterator on the first message of the
// range [lo, hi) of queue qid; false if there is none (or the iterator
// could not be opened).
func (sc *popScratch) messages(ac *applyCtx, tid uint32, qid, pid uint64, lo, hi []byte) bool {
	if sc.it == nil {
		qp := msgQueuePrefix(tid, qid)
		if sc.it = ac.iterRange(qp, prefixEnd(qp)); sc.it == nil {
			return false
		}
	}
	sc.hi = hi
	steps := 0
	switch {
	case sc.atLast:
		steps = 1
	case sc.stepped && sc.endPid != 0 && sc.endPid+1 == pid:
		steps = maxPopSteps
	}
	sc.atLast, sc.endPid = false, 0
	if steps > 0 && sc.it.Valid() && bytes.Compare(sc.it.Key(), lo) < 0 {
		// Steps, where a seek positions every level of the LSM: the
		// first key at or past lo is the range's first if it is below hi.
		for ; steps > 0; steps-- {
			if !sc.it.Next() {
				if sc.it.Error() != nil {
					return false // check reports it; a seek would clear it
				}
				break
			}
			if k := sc.it.Key(); bytes.Compare(k, lo) >= 0 {
				if bytes.Compare(k, hi) < 0 {
					sc.stepped = true
					return true
				}
				break
			}
		}
	}
	sc.stepped = false
	return sc.it.SeekGE(lo) && bytes.Compare(sc.it.Key(), hi) < 0
}

// maxPopSteps bounds the steps messages tries before it seeks: a partition
// left at its last message is followed by a dedup key for each of its
// messages but its first, and a few messages per partition are what a pop
// over many partitions meets.
const maxPopSteps = 4

// next steps to the next message of the range messages positioned on.
func (sc *popScratch) next() bool {
	sc.stepped = true
	return sc.it.Next() && bytes.Compare(sc.it.Key(), sc.hi) < 0
}

// check stops the batch on an error the iterator met in this partition
// (the next positioning would forget it).
func (sc *popScratch) check(ac *applyCtx) {
	if sc.it == nil {
		return
	}
	if err := sc.it.Error(); err != nil {
		k := append([]byte(nil), sc.it.Key()...)
		ac.fail(k, "scan", err)
	}
}

// fit trims what a pop keeps alive: the result gets its deliveries in a
// slice of their own size, and the store keeps the slice they were
// gathered in (cleared) for the next pop; the last arena chunk is sized
// for the whole batch, and the result lives on in the reply (and, on a
// node that did not propose the pop, until its apply's results are
// dropped). A long-polling consumer asking for 1,000 and getting one
// message would otherwise hold about 150 KiB per pop.
func (sc *popScratch) fit(s *Store, res *PopResult) {
	gathered := res.Messages
	if len(gathered) == 0 {
		res.Messages = nil
	} else {
		res.Messages = slices.Clone(gathered)
		clear(gathered) // the kept slice must not keep the messages alive
	}
	if cap(gathered) <= popMsgsKept {
		s.popMsgs = gathered[:0]
	}
	if len(res.Messages) == 0 {
		sc.arena.buf = nil
		return
	}
	if spare := cap(sc.arena.buf) - len(sc.arena.buf); spare > msgArenaMin && spare > len(sc.arena.buf) {
		// The payloads, and the ids decoded in place beside them, move to
		// a buffer of their own size.
		total := 0
		for i := range res.Messages {
			m := &res.Messages[i]
			total += len(m.Payload) + len(m.TxID) + len(m.TraceID)
		}
		buf := make([]byte, 0, total)
		str := func(v string) string {
			if v == "" {
				return ""
			}
			start := len(buf)
			buf = append(buf, v...)
			return unsafe.String(&buf[start], len(v))
		}
		for i := range res.Messages {
			m := &res.Messages[i]
			if m.Payload != nil {
				start := len(buf)
				buf = append(buf, m.Payload...)
				m.Payload = buf[start:len(buf):len(buf)]
			}
			m.TxID, m.TraceID = str(m.TxID), str(m.TraceID)
		}
	}
	sc.arena.buf = nil
}

func (sc *popScratch) close(ac *applyCtx) {
	if sc.it != nil {
		ac.closeIter(sc.it)
		sc.it = nil
	}
}

// popMsgsKept bounds the slice of deliveries the store keeps between pops.
const popMsgsKept = 1024

// msgArena holds the copies of the messages a pop delivers, many to an
// allocation: a delivered message's payload and ids share its memory, which
// is never written again once a message is in it.
type msgArena struct{ buf []byte }

// msgArenaMin and msgArenaMax bound an arena chunk.
const (
	msgArenaMin = 1 << 10
	msgArenaMax = 1 << 20
)

// copy returns a copy of v in the arena; want is how many more messages of
// about v's size may follow, v's included (a new chunk's size, with an
// eighth more for messages a little longer than v). A chunk sized for the
// rest, not twice the last one: a pop of messages that grow by a few bytes
// would otherwise fill its first chunk just before its last message, take
// a second one as large, and have fit copy every message once more to
// give back the second one's unused part.
func (a *msgArena) copy(v []byte, want int) []byte {
	if cap(a.buf)-len(a.buf) < len(v) {
		n := len(v) * want
		n += n / 8
		n = min(max(n, msgArenaMin), msgArenaMax)
		a.buf = make([]byte, 0, max(n, len(v)))
	}
	start := len(a.buf)
	a.buf = append(a.buf, v...)
	return a.buf[start:len(a.buf):len(a.buf)]
}

// deliver hands out up to limit messages of one partition to a group, in
// offset order, appended to out, and leases the partition (unless autoAck).
func (ac *applyCtx) deliver(out []Delivered, sc *popScratch, tid uint32, q *queueRec, s *subRec, pid uint64, p *partRec, limit int, autoAck bool, lease [16]byte, leaseSecs int64) []Delivered {
	cur := ac.cursor(tid, s, pid, p)
	pending := sc.unready && !cur.Ready
	if pending {
		cur.Ready = true
	}
	unready := func() {
		if !pending {
			ac.clearReady(tid, s, pid, cur)
			return
		}
		pending, cur.Ready = false, false
		if !cur.derived {
			ac.markCursor(tid, s, pid, cur)
		}
	}
	if pending {
		defer func() {
			if pending && cur.Ready {
				cur.Ready = false
				ac.setReady(tid, s, pid, cur)
			}
		}()
	}
	if cur.leased(ac.now) {
		unready()
		return out
	}
	// A leasing pop writes the cursor only if it changes more than the
	// overlay its lease record carries says (lease_overlay.go): not when
	// the cursor holds an overlay not yet written (the lease record that
	// replaces it in the lease index would lose it), nor when a pop of
	// this log entry leased it before (the stamp could not tell the two
	// apart), nor when it ends a lapsed lease or finds requeued messages
	// gone. What the commands before it changed and the flush has yet to
	// write is written as it is now.
	ref := curRef(tid, s.ID, pid)
	// (A cursor the flush is to write is written whole, overlay and all;
	// the one it is to write may be of an epoch before a seek.)
	pend, dirty := ac.dirtyCur[ref]
	mustWrite := autoAck || cur.unwritten && pend != cur || cur.Stamp == ac.index || cur.LeaseExpires != 0
	changed := false
	if dirty && !mustWrite {
		ac.captureCursor(ref, pend)
	}
	if cur.LeaseExpires != 0 {
		ac.expireLease(tid, s, pid, cur)
	}
	if !hasWork(cur, p) {
		unready()
		return out
	}
	var blockedUntil int64
	if w := q.Options.WindowBuffer; w > 0 && p.LastTime+w*1e6 > ac.now {
		blockedUntil = p.LastTime + w*1e6
	}
	first := len(out)
	limit += first
	cur.recent, cur.recentPos = cur.recent[:0], 0
	delay := q.Options.DelayedProcessing * 1e6
	take := func(off uint64, m msgRec) bool {
		// A message not delivered leaves no blank exception behind: the
		// cursor of a pop that does not write it must be what its record
		// and the overlay give.
		if i := cur.find(off); i >= 0 && cur.Ex[i].VisibleAt > ac.now {
			blockedUntil = cur.Ex[i].VisibleAt
			return false
		}
		if delay > 0 && m.CreatedAt+delay > ac.now {
			blockedUntil = m.CreatedAt + delay
			return false
		}
		x := cur.ex(off)
		x.Attempt++
		x.VisibleAt = 0
		d := Delivered{
			PartitionID: pid, Partition: p.Name, Offset: off, TxID: m.TxID, TraceID: m.TraceID,
			CreatedAt: m.CreatedAt, Payload: m.Payload, Sealed: m.Sealed,
			Attempt: x.Attempt, Retries: x.Retries,
		}
		if autoAck {
			x.Flags = exDone
			s.Pending--
			s.Consumed++
		} else {
			cur.LeaseOffs = append(cur.LeaseOffs, off)
			cur.recent = append(cur.recent, txOff{m.TxID, off})
		}
		out = append(out, d)
		return true
	}
	if blockedUntil == 0 {
		// Requeued messages (below the cursor) come first, in offset order.
		var requeued []uint64
		for _, x := range cur.Ex {
			if x.Flags&exRequeued != 0 && x.Flags&exDone == 0 {
				requeued = append(requeued, x.Off)
			}
		}
		for _, off := range requeued {
			if len(out) >= limit || blockedUntil != 0 {
				break
			}
			k := msgKey(tid, q.ID, pid, off)
			v := ac.get(k)
			if v == nil {
				x := cur.ex(off)
				x.Flags = exDone // the message is gone (retention)
				changed = true
				continue
			}
			m, err := decodeMsgView(sc.arena.copy(v, limit-len(out)))
			if err != nil {
				ac.corrupt(k, "message", err)
				break
			}
			if !take(off, m) {
				break
			}
		}
	}
	if blockedUntil == 0 && len(out) < limit && cur.Cursor < p.Next {
		ok := sc.messages(ac, tid, q.ID, pid, msgKey(tid, q.ID, pid, cur.Cursor), msgKey(tid, q.ID, pid, p.Next))
		it := sc.it
		for ok && len(out) < limit {
			off := lastU64(it.Key())
			if i := cur.find(off); i < 0 || cur.Ex[i].Flags&exDone == 0 {
				// The chunk is sized for the messages that may follow from
				// this partition, not for the whole batch: a long poll that
				// asks for many usually finds one.
				want := limit - len(out)
				if left := p.Next - off; left < uint64(want) {
					want = int(left)
				}
				m, err := decodeMsgView(sc.arena.copy(it.Value(), want))
				if err != nil {
					ac.corrupt(it.Key(), "message", err)
					break
				}
				if !take(off, m) {
					break
				}
			}
			if off+1 >= p.Next {
				// The last message: no step past it, so that the next
				// partition's SeekGE follows a SeekGE, which Pebble may
				// serve by stepping; unless the next key is known to be
				// the next partition's (popScratch.atLast), or the
				// iterator got here by a step (popScratch.endPid).
				sc.atLast = off == 0 && p.FirstTx != ""
				sc.endPid = pid
				break
			}
			ok = sc.next()
		}
		sc.check(ac)
	}
	if autoAck {
		cur.normalize()
	} else {
		cur.keepRecent()
	}
	leasing := !autoAck && len(out) > first
	if !leasing {
		ac.markCursor(tid, s, pid, cur)
	}
	switch {
	case len(out) == first && blockedUntil != 0:
		unready()
		ac.set(delayedKey(blockedUntil, tid, s.ID, pid), nil)
		ac.schedule(blockedUntil)
	case len(out) == first:
		unready()
	case !autoAck:
		at := ac.now + leaseSecs*1e6
		cur.LeaseID = lease
		cur.LeaseExpires = at
		cur.Stamp = ac.index
		if _, dirty := ac.dirtyCur[ref]; mustWrite || changed || dirty {
			// (dirty: this pop ended a lapsed lease, or a cursor of the
			// epoch before a seek is still to be written.)
			ac.markCursor(tid, s, pid, cur)
			ac.takeLease(tid, lease, s.ID, pid, at, nil)
			unready()
			break
		}
		// Not written: the lease record carries the change.
		if pending {
			pending, cur.Ready = false, false
		} else if cur.Ready {
			ac.delReady(tid, s.ID, pid)
			cur.Ready = false
		}
		cur.derived = false
		cur.unwritten = true
		// Not derived any more, so not to be derived without a read
		// (partRec.noCursor), as markCursor would say.
		p.noCursor = false
		ac.cursors[ref] = cur // a derived cursor may not be cached (cursorAt)
		ac.takeLease(tid, lease, s.ID, pid, at, newOverlay(cur, lease, ac.index, s.Epoch, at))
	case !hasWork(cur, p):
		unready()
	case !cur.Ready:
		// An autoAck pop left work in a partition that was not ready: it
		// found the lease lapsed and ended it above, so no tick will make
		// the partition ready again. (A pending claim keeps Ready set and
		// is settled by the deferred setReady.)
		ac.setReady(tid, s, pid, cur)
		ac.wake(tid, q.Name)
	}
	// s needs no marking: pop marked it when it began, and the flush
	// writes it as it ends up.
	return out
}

// expireLease ends a lease: its unacknowledged offsets become available again.
func (ac *applyCtx) expireLease(tid uint32, s *subRec, pid uint64, cur *cursorRec) {
	ac.releaseLeaseIndex(tid, s.ID, pid, cur)
	cur.clearLease()
	ac.markCursor(tid, s, pid, cur)
}

// keepRecent gives the remembered deliveries' transaction ids (which share
// the pop's message arena) memory of their own, one string for them all,
// so that a cached cursor does not hold on to the messages' copies.
func (c *cursorRec) keepRecent() {
	n := 0
	for _, d := range c.recent {
		n += len(d.txid)
	}
	if n == 0 {
		return
	}
	b := make([]byte, 0, n)
	for _, d := range c.recent {
		b = append(b, d.txid...)
	}
	all := unsafe.String(unsafe.SliceData(b), len(b))
	at := 0
	for i := range c.recent {
		l := len(c.recent[i].txid)
		c.recent[i].txid = all[at : at+l]
		at += l
	}
}
