package state

import (
	"encoding/json"
	"slices"
)

// Ack statuses.
const (
	AckCompleted = "completed"
	AckFailed    = "failed"
	AckRetry     = "retry"
	AckDLQ       = "dlq"
)

func (ac *applyCtx) ack(c *Ack) *AckResult {
	res := &AckResult{Items: make([]AckItemResult, len(c.Items))}
	tid, ok := ac.tenantID(c.Tenant, false)
	var run ackRun
	for i := range c.Items {
		r := &res.Items[i]
		r.TxID = c.Items[i].TxID
		if !ok {
			r.Error = "not_found"
			continue
		}
		if c.Items[i].Count > 1 {
			ac.ackRunItem(tid, &c.Items[i], r, &run)
			continue
		}
		tg, code := ac.ackResolveIn(tid, &c.Items[i], &run)
		r.TxID, r.lookedUp = tg.txid, c.Items[i].TxID == "" && tg.txid != ""
		if code != "" {
			r.Error = code
			continue
		}
		ac.ackApplyIn(tid, tg, &c.Items[i], r, &run)
	}
	run.settle(ac, tid)
	return res
}

// ackRunItem applies an item of several offsets (AckItem.Count) as that
// many items of one offset each, in offset order. Its result succeeds if
// every one did; else it holds the first one's error. A lease released or
// a message dead-lettered by any of them is reported.
func (ac *applyCtx) ackRunItem(tid uint32, a *AckItem, r *AckItemResult, run *ackRun) {
	if a.Offset == nil {
		r.Error = "message_not_found" // never logged so: the decoder refuses it
		return
	}
	one := *a
	// A run's reply names no transaction ids: none is looked up.
	one.Count, one.TxIDKnown = 0, true
	first := *a.Offset
	var off uint64
	one.Offset = &off
	r.Success = true
	for k := uint64(0); k < a.Count; k++ {
		off = first + k
		tg, code := ac.ackResolveIn(tid, &one, run)
		if code != "" {
			if r.Success {
				r.Success, r.Error = false, code
			}
			continue
		}
		var ri AckItemResult
		ac.ackApplyIn(tid, tg, &one, &ri, run)
		r.LeaseReleased = r.LeaseReleased || ri.LeaseReleased
		r.DLQ = r.DLQ || ri.DLQ
	}
}

// ackTarget is an acknowledgement resolved against state, not yet applied.
type ackTarget struct {
	q        *queueRec
	p        *partRec
	s        *subRec
	pid, off uint64
	cur      *cursorRec
	exi      int  // the index of off's exception in cur, -1: none
	finished bool // already acknowledged or dead-lettered: a no-op
	txid     string
}

// ackRun is what the items of one ack command share. Its items usually
// come as runs of one partition and group under one lease: the records of
// the last item's partition and group, and the last lease id parsed, serve
// the next item; and the cursors the items change are settled (normalized,
// written, made ready) once, when the command ends, not once per item.
type ackRun struct {
	pid      uint64
	group    string
	q        *queueRec
	p        *partRec
	s        *subRec
	cur      *cursorRec // nil until resolved
	leaseStr string
	lease    [16]byte
	leaseOK  bool
	exNext   int // where the next item's exception likely is (acks come in delivery order)

	changed []ackChange
	index   map[*cursorRec]int // into changed, once it is long
}

// ackChange is a cursor an ack command changed, to settle at its end.
type ackChange struct {
	s        *subRec
	q        *queueRec
	p        *partRec
	pid      uint64
	cur      *cursorRec
	subDirty bool
}

// note records that an applied item changed cur (and its subscription's
// counts when subDirty).
func (run *ackRun) note(tg *ackTarget, subDirty bool) {
	i := -1
	if n := len(run.changed); n > 0 && run.changed[n-1].cur == tg.cur {
		i = n - 1
	} else if run.index != nil {
		if j, ok := run.index[tg.cur]; ok {
			i = j
		}
	} else {
		for j := range run.changed {
			if run.changed[j].cur == tg.cur {
				i = j
				break
			}
		}
	}
	if i < 0 {
		i = len(run.changed)
		run.changed = append(run.changed, ackChange{s: tg.s, q: tg.q, p: tg.p, pid: tg.pid, cur: tg.cur})
		if run.index == nil && len(run.changed) > 8 {
			run.index = make(map[*cursorRec]int, 2*len(run.changed))
			for j := range run.changed {
				run.index[run.changed[j].cur] = j
			}
		} else if run.index != nil {
			run.index[tg.cur] = i
		}
	}
	run.changed[i].subDirty = run.changed[i].subDirty || subDirty
}

// settle finishes every cursor the command changed: the cursor moves over
// the finished offsets, the records are marked for writing, and a partition
// whose lease is gone and that has more to read becomes ready again.
func (run *ackRun) settle(ac *applyCtx, tid uint32) {
	var marked *subRec
	for i := range run.changed {
		ch := &run.changed[i]
		if ch.subDirty && ch.s == marked {
			ch.subDirty = false // marked already: once is enough
		} else if ch.subDirty {
			marked = ch.s
		}
		ac.settleAck(tid, ch)
	}
	run.changed = run.changed[:0]
	run.index = nil
}

func (ac *applyCtx) settleAck(tid uint32, ch *ackChange) {
	cur := ch.cur
	cur.normalize()
	ac.markCursor(tid, ch.s, ch.pid, cur)
	if ch.subDirty {
		ac.markSub(tid, ch.q.ID, ch.s)
	}
	if cur.LeaseExpires == 0 && hasWork(cur, ch.p) {
		ac.setReady(tid, ch.s, ch.pid, cur)
		if q := ac.queue(tid, ch.p.Queue); q != nil {
			ac.wake(tid, q.Name)
		}
	}
}

// recentOffset looks a transaction id up among the messages the group's
// cached cursor delivered last. It only peeks at the cache: an ack must not
// create a cursor record before it is known to be valid.
func (ac *applyCtx) recentOffset(tid uint32, s *subRec, pid uint64, txid string) (uint64, bool) {
	c := ac.cursors[curRef(tid, s.ID, pid)]
	if c == nil || c.Epoch != s.Epoch {
		return 0, false
	}
	return c.recentOffset(txid)
}

// ackResolve checks an acknowledgement without changing state. It returns
// an error code when the acknowledgement must be refused.
func (ac *applyCtx) ackResolve(tid uint32, a *AckItem) (ackTarget, string) {
	return ac.ackResolveIn(tid, a, nil)
}

// ackResolveIn is ackResolve within an ack command's run (nil: none).
func (ac *applyCtx) ackResolveIn(tid uint32, a *AckItem, run *ackRun) (ackTarget, string) {
	var tg ackTarget
	tg.txid = a.TxID
	switch a.Status {
	case AckCompleted, "success", AckFailed, AckRetry, AckDLQ:
	default:
		return tg, "invalid_status"
	}
	group := a.Group
	if group == "" {
		group = QueueModeGroup
	}
	var cur *cursorRec
	if run != nil && run.s != nil && run.pid == a.PartitionID && run.group == group {
		tg.q, tg.p, tg.s, cur = run.q, run.p, run.s, run.cur
	} else {
		qid := ac.partQueue(tid, a.PartitionID)
		tg.q = ac.queue(tid, qid)
		if tg.q == nil {
			return tg, "not_found"
		}
		tg.p = ac.part(tid, qid, a.PartitionID)
		tg.s = ac.sub(tid, qid, group)
		if tg.p == nil || tg.s == nil {
			return tg, "not_found"
		}
		if run != nil {
			*run = ackRun{pid: a.PartitionID, group: group, q: tg.q, p: tg.p, s: tg.s,
				leaseStr: run.leaseStr, lease: run.lease, leaseOK: run.leaseOK,
				changed: run.changed, index: run.index}
		}
	}
	tg.pid = a.PartitionID
	if a.Offset != nil {
		tg.off = *a.Offset
	} else if o, ok := ac.recentOffsetIn(tid, tg.s, a.PartitionID, a.TxID, cur); ok && o >= tg.p.First && o < tg.p.Next {
		// A remembered (partition, txid) offset is right while the message
		// is retained: a txid can only be stored again once its message is
		// gone. Whether it is remembered changes only the speed.
		tg.off = o
	} else {
		o, found := ac.dedupLookup(tid, a.PartitionID, tg.p, a.TxID)
		if !found {
			return tg, "message_not_found"
		}
		tg.off = o
	}
	if tg.off < tg.p.First || tg.off >= tg.p.Next {
		return tg, "message_not_found"
	}
	if cur == nil {
		cur = ac.cursor(tid, tg.s, a.PartitionID, tg.p)
		if run != nil {
			run.cur = cur
		}
	}
	tg.cur = cur
	if tg.txid == "" && !a.TxIDKnown {
		// The reply names the message's transaction id: from the lease's
		// deliveries when they are remembered, else from the message.
		if txid, ok := cur.recentTxID(tg.off); ok {
			tg.txid = txid
		} else {
			k := msgKey(tid, tg.q.ID, a.PartitionID, tg.off)
			if v := ac.get(k); v != nil {
				if m, err := decodeMsg(v); err == nil {
					tg.txid = m.TxID
				} else {
					ac.corrupt(k, "message", err)
				}
			}
		}
	}
	// Already finished for this group: acknowledging again (a retry whose
	// first reply was lost) succeeds and changes nothing, whatever the lease.
	i := -1
	if run != nil && run.exNext < len(cur.Ex) && cur.Ex[run.exNext].Off == tg.off {
		i = run.exNext
	} else {
		i = cur.find(tg.off)
	}
	if run != nil && i >= 0 {
		run.exNext = i + 1
	}
	tg.exi = i
	tg.finished = (i >= 0 && cur.Ex[i].Flags&exDone != 0) || (tg.off < cur.Cursor && (i < 0 || cur.Ex[i].Flags&exRequeued == 0))
	if tg.finished {
		return tg, ""
	}
	inLease := cur.LeaseExpires != 0 && leaseIndex(cur.LeaseOffs, tg.off) >= 0
	if a.LeaseID != "" {
		var id [16]byte
		var ok bool
		if run != nil && run.leaseStr == a.LeaseID && run.leaseStr != "" {
			id, ok = run.lease, run.leaseOK
		} else {
			id, ok = parseLeaseID(a.LeaseID)
			if run != nil {
				run.leaseStr, run.lease, run.leaseOK = a.LeaseID, id, ok
			}
		}
		if !ok || cur.LeaseExpires == 0 || cur.LeaseID != id || cur.LeaseExpires <= ac.now || !inLease {
			return tg, "lease_expired"
		}
	} else if cur.leased(ac.now) && !inLease {
		return tg, "lease_expired"
	}
	return tg, ""
}

// recentOffsetIn is recentOffset, looking in cur when the caller has it.
func (ac *applyCtx) recentOffsetIn(tid uint32, s *subRec, pid uint64, txid string, cur *cursorRec) (uint64, bool) {
	if cur != nil {
		return cur.recentOffset(txid)
	}
	return ac.recentOffset(tid, s, pid, txid)
}

// leaseIndex returns the index of off among a lease's offsets, or -1. The
// offsets are in delivery order, which is ascending, and acks mostly come
// in that order: the first offset is tried first.
func leaseIndex(offs []uint64, off uint64) int {
	if len(offs) > 0 && offs[0] == off {
		return 0
	}
	if i, ok := slices.BinarySearch(offs, off); ok {
		return i
	}
	return slices.Index(offs, off) // offsets out of order: never written so, but read safely
}

// ackApply applies a resolved acknowledgement and settles its cursor.
func (ac *applyCtx) ackApply(tid uint32, tg ackTarget, a *AckItem, r *AckItemResult) {
	ac.ackApplyIn(tid, tg, a, r, nil)
}

// ackApplyIn is ackApply within an ack command's run, which settles the
// cursor when the command ends (nil: at once).
func (ac *applyCtx) ackApplyIn(tid uint32, tg ackTarget, a *AckItem, r *AckItemResult, run *ackRun) {
	r.Success = true
	cur, s := tg.cur, tg.s
	subDirty := false
	// Already finished: acknowledging again is harmless and changes nothing.
	if i := tg.exi; !tg.finished && (i < 0 || cur.Ex[i].Flags&exDone == 0) {
		var x *exception
		if i >= 0 {
			x = &cur.Ex[i]
		} else {
			x = cur.ex(tg.off)
		}
		switch a.Status {
		case AckCompleted, "success":
			x.Flags = exDone
			s.Pending--
			s.Consumed++
		case AckFailed:
			x.Retries++
			if int64(x.Retries) > tg.q.Options.RetryLimit {
				ac.deadLetter(tid, s, tg.pid, tg.off, x, a.Error)
				r.DLQ = true
			} else if tg.q.Options.RetryDelay > 0 {
				x.VisibleAt = ac.now + tg.q.Options.RetryDelay*1000
			}
		case AckRetry:
			if x.Attempt > 0 {
				x.Attempt--
			}
		case AckDLQ:
			ac.deadLetter(tid, s, tg.pid, tg.off, x, a.Error)
			r.DLQ = true
		}
		subDirty = true
	}
	ac.dropFromLease(tid, s, tg.pid, cur, tg.off, r)
	if run != nil && cur.LeaseExpires != 0 {
		// Under a lease the partition cannot become ready: the cursor
		// is settled when the command ends.
		run.note(&tg, subDirty)
		return
	}
	// The lease is gone (released by this item, or there was none): settle
	// now, so that whether the partition is ready is decided here, as
	// when items come one to a command.
	ac.settleAck(tid, &ackChange{s: s, q: tg.q, p: tg.p, pid: tg.pid, cur: cur, subDirty: subDirty})
}

// dropFromLease removes an acknowledged offset from the lease, and releases
// the lease once every offset of it is acknowledged.
func (ac *applyCtx) dropFromLease(tid uint32, s *subRec, pid uint64, cur *cursorRec, off uint64, r *AckItemResult) {
	i := leaseIndex(cur.LeaseOffs, off)
	if i < 0 {
		return
	}
	if i == 0 {
		cur.LeaseOffs = cur.LeaseOffs[1:]
	} else {
		cur.LeaseOffs = slices.Delete(cur.LeaseOffs, i, i+1)
	}
	if len(cur.LeaseOffs) == 0 {
		ac.expireLease(tid, s, pid, cur)
		r.LeaseReleased = true
	}
}

// deadLetter moves one message of a group to its dead-letter queue.
func (ac *applyCtx) deadLetter(tid uint32, s *subRec, pid, off uint64, x *exception, errText string) {
	x.Flags = exDone
	x.VisibleAt = 0
	s.Pending--
	s.DLQ++
	seq := ac.m.NextDLQ
	ac.m.NextDLQ++
	rec := dlqRec{Partition: pid, Offset: off, Error: errText, Attempts: x.Attempt, FailedAt: ac.now}
	b, err := json.Marshal(&rec)
	if err != nil {
		ac.s.log.Error("encode dead letter", "err", err)
		return
	}
	ac.set(dlqKey(tid, s.ID, seq), b)
	ac.set(dlqIndexKey(tid, s.ID, pid, off), binaryU64(seq))
}

func (ac *applyCtx) extend(c *ExtendLease) *ExtendResult {
	res := &ExtendResult{}
	tid, ok := ac.tenantID(c.Tenant, false)
	id, okID := parseLeaseID(c.LeaseID)
	if !ok || !okID {
		res.Error = "lease_not_found"
		return res
	}
	holds := ac.leaseHolds(tid, id)
	expired := false
	var dues []int64
	for _, h := range holds {
		q, _, s, cur, ok := ac.heldCursor(tid, h.sub, h.pid, id)
		if !ok {
			continue
		}
		if cur.LeaseExpires <= ac.now {
			expired = true
			continue
		}
		secs := c.Seconds
		if secs <= 0 {
			secs = q.Options.LeaseTime
		}
		at := ac.now + secs*1e6
		if h.old {
			ac.del(leaseExpKey(cur.LeaseExpires, tid, s.ID, h.pid))
			ac.set(leaseExpKey(at, tid, s.ID, h.pid), nil)
		} else if !slices.Contains(dues, at) {
			// The due keys of the old expiry stay: Tick finds nothing
			// due under them and deletes them.
			ac.set(leaseDueKey(at, tid, id), nil)
			dues = append(dues, at)
		}
		cur.LeaseExpires = at
		ac.markCursor(tid, s, h.pid, cur)
		ac.schedule(cur.LeaseExpires)
		res.Success = true
		if res.ExpiresAt == 0 || cur.LeaseExpires < res.ExpiresAt {
			res.ExpiresAt = cur.LeaseExpires
		}
	}
	if !res.Success {
		if expired {
			res.Error = "lease_expired"
		} else {
			res.Error = "lease_not_found"
		}
	}
	return res
}

// subByID finds a subscription of a queue by id (a scan of the queue's few
// subscriptions).
func (ac *applyCtx) subByID(tid uint32, qid, sub uint64) *subRec {
	for _, k := range ac.subsOf(tid, qid) {
		if s := ac.subByKey(k); s != nil && s.ID == sub {
			return s
		}
	}
	return nil
}

// tickLimit bounds the work of one Tick; the rest waits for the next.
const tickLimit = 10000

// tick ends expired leases and wakes delayed partitions due by now.
func (ac *applyCtx) tick() *CountResult {
	res := &CountResult{}
	type due struct {
		at       int64
		tid      uint32
		sub, pid uint64
		lease    bool
		record   bool // a lease record's due key (id): see tickLease
		id       [16]byte
	}
	var items []due
	for _, tb := range []byte{tLeaseExp, tDelayed} {
		it := ac.iterRange([]byte{tb}, newKey(tb, 8).i64(ac.now+1))
		if it == nil {
			continue
		}
		for ok := it.First(); ok && len(items) < tickLimit; ok = it.Next() {
			if tb == tLeaseExp {
				if at, tid, id, valid := leaseDueParts(it.Key()); valid {
					items = append(items, due{at: at, tid: tid, lease: true, record: true, id: id})
					continue
				}
			}
			at, tid, sub, pid, valid := timeKeyParts(it.Key())
			if valid {
				items = append(items, due{at: at, tid: tid, sub: sub, pid: pid, lease: tb == tLeaseExp})
			}
		}
		ac.closeIter(it)
	}
	for _, d := range items {
		if d.record {
			ac.del(leaseDueKey(d.at, d.tid, d.id))
			res.Count += ac.tickLease(d.tid, d.id)
			continue
		}
		if d.lease {
			ac.del(leaseExpKey(d.at, d.tid, d.sub, d.pid))
		} else {
			ac.del(delayedKey(d.at, d.tid, d.sub, d.pid))
		}
		qid := ac.partQueue(d.tid, d.pid)
		q := ac.queue(d.tid, qid)
		p := ac.part(d.tid, qid, d.pid)
		s := ac.subByID(d.tid, qid, d.sub)
		if q == nil || p == nil || s == nil {
			continue
		}
		cur := ac.cursor(d.tid, s, d.pid, p)
		if d.lease {
			if cur.LeaseExpires != d.at {
				continue // stale: extended, released or reset since
			}
			ac.expireLease(d.tid, s, d.pid, cur)
		}
		if cur.LeaseExpires == 0 && hasWork(cur, p) {
			ac.setReady(d.tid, s, d.pid, cur)
			ac.wake(d.tid, q.Name)
		}
		res.Count++
	}
	res.Count += ac.expireKV(tickLimit)
	res.Count += ac.expireRetention(tickLimit)
	return res
}
