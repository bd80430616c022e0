package state

import (
	"encoding/binary"
)

func (ac *applyCtx) partIDByName(tid uint32, qid uint64, name string) uint64 {
	return ac.partIDIn(tid, qid, nil, name)
}

// partIDIn is partIDByName for a partition of q (nil: look q up only if
// needed), which lets a name that q's filter does not hold skip the read.
func (ac *applyCtx) partIDIn(tid uint32, qid uint64, q *queueRec, name string) uint64 {
	ac.keyBuf = kb(append(ac.keyBuf[:0], tPartName)).u32(tid).u64(qid).str(name)
	return ac.partIDHashed(tid, qid, q, name, nameHash(ac.keyBuf))
}

// partIDHashed is partIDIn given the hash h of the name key.
func (ac *applyCtx) partIDHashed(tid uint32, qid uint64, q *queueRec, name string, h uint64) uint64 {
	ac.keyBuf = kb(append(ac.keyBuf[:0], tPartName)).u32(tid).u64(qid).str(name)
	nk := ac.keyBuf
	// The filter holds every name that exists, so it answers a new name
	// first (a snapshot's names are all new).
	if q != nil {
		if f := ac.partNames(tid, q); f != nil && !f.mayHold(h) {
			return 0
		}
	}
	// The cache maps the name key's hash to an id; the cached record of
	// that id confirms the name.
	if id, ok := ac.partIDs.get(h); ok {
		if p, _ := ac.parts.get(id); p != nil && p.tid == tid && p.Queue == qid && p.Name == name {
			return id
		}
	}
	var id uint64
	if v := ac.get(nk); len(v) == 8 {
		id = lastU64(v)
	}
	if id != 0 {
		ac.partIDs.put(h, id)
	}
	return id
}

// part returns partition pid of queue qid, nil if there is none.
func (ac *applyCtx) part(tid uint32, qid, pid uint64) *partRec {
	if p, ok := ac.parts.get(pid); ok {
		if p != nil && (p.tid != tid || p.Queue != qid) {
			return nil // the id is another queue's
		}
		return p
	}
	k := partKey(tid, qid, pid)
	var p *partRec
	if v := ac.get(k); v != nil {
		var err error
		if p, err = decodePart(v); err != nil {
			ac.corrupt(k, "partition", err)
			p = nil
		} else {
			completeTail(p, tid, pid, ac.iterRange)
		}
	}
	if p != nil || qid != 0 {
		// An id is one partition's for ever, so "absent" holds for any
		// queue once a lookup with a real queue found nothing: such a
		// lookup comes with the queue the id was found under.
		ac.cachePart(tid, pid, p)
	}
	return p
}

// cachePart caches partition pid's record (nil: absent).
func (ac *applyCtx) cachePart(tid uint32, pid uint64, p *partRec) {
	if p != nil {
		p.tid = tid
	}
	ac.parts.put(pid, p)
}

// markPart records a change of a partition field other than its tail (a
// push's new messages change only the tail: see completeTail).
func (ac *applyCtx) markPart(tid uint32, pid uint64, p *partRec) {
	p.markTail()
	ac.dirty[string(partKey(tid, p.Queue, pid))] = p
}

// appendPart appends a new partition's record, key then value, to b and
// returns it with the key's end. The caller writes it into the batch before
// the command ends, so that scans of the queue's partitions by later
// commands of the batch (backfill) see it. Flush writes the record again
// only if a field other than the tail changes after it (markPart).
func appendPart(b []byte, tid uint32, pid uint64, p *partRec) ([]byte, int) {
	p.markTail()
	b = kb(append(b, tPart)).u32(tid).u64(p.Queue).u64(pid)
	k1 := len(b)
	return p.appendTo(b), k1
}

// partQueue returns the queue id of a partition id, 0 if unknown.
func (ac *applyCtx) partQueue(tid uint32, pid uint64) uint64 {
	// Partition ids are unique across tenants; the cached entry remembers
	// the tenant so that one tenant cannot resolve another's partition.
	if l, ok := ac.partLocs[pid]; ok {
		if l.tid != tid {
			return 0
		}
		return l.qid
	}
	if r, ok := ac.locRuns.find(pid); ok {
		if r.tid != tid {
			return 0
		}
		return r.qid
	}
	if r := ac.loc; r.last != 0 && pid >= r.first && pid <= r.last {
		if r.tid != tid {
			return 0
		}
		return r.qid
	}
	it := ac.iterRange(partLocKey(tid, pid), prefixEnd(partLocPrefix(tid)))
	if it == nil {
		return 0
	}
	var qid uint64
	if it.First() {
		if v := it.Value(); len(v) >= 8 && decodeLocFirst(v, lastU64(it.Key())) <= pid {
			qid = lastU64(v[:8])
		}
	}
	ac.closeIter(it)
	if qid != 0 {
		ac.partLocs[pid] = partLoc{tid: tid, qid: qid}
	}
	return qid
}

// A partition locator maps a partition id to its queue. Partitions that
// one command creates in one queue get consecutive ids, so one key stands
// for a run of them: its key holds the run's last id and its value the
// queue id and the run's first id (a value of the queue id alone is a run
// of one). Runs never overlap: ids are never reused.

// noteLocator adds a partition created by the running command to the
// command's open locator run, writing the run it ends, if any.
func (ac *applyCtx) noteLocator(tid uint32, qid, pid uint64) {
	if r := &ac.loc; r.last != 0 && r.tid == tid && r.qid == qid && r.last+1 == pid {
		r.last = pid
		return
	}
	ac.closeLocator()
	ac.loc = locRun{tid: tid, qid: qid, first: pid, last: pid}
}

// closeLocator writes the open locator run. Runs end with the command that
// created them, so every replica writes the same keys however its log
// entries were batched.
func (ac *applyCtx) closeLocator() {
	r := ac.loc
	if r.last == 0 {
		return
	}
	ac.loc = locRun{}
	ac.scratch = kb(append(ac.scratch[:0], tPartLoc)).u32(r.tid).u64(r.last)
	nk := len(ac.scratch)
	ac.scratch = binary.BigEndian.AppendUint64(ac.scratch, r.qid)
	if r.first != r.last {
		ac.scratch = binary.BigEndian.AppendUint64(ac.scratch, r.first)
	}
	ac.set(ac.scratch[:nk], ac.scratch[nk:])
	ac.locRuns.add(r)
}

// decodeLocFirst returns the first id of the run a locator value of the
// run ending at last describes.
func decodeLocFirst(v []byte, last uint64) uint64 {
	if len(v) == 16 {
		return lastU64(v)
	}
	return last
}

type partLoc struct {
	tid uint32
	qid uint64
}

// firstAtOrAfter finds the first offset of p whose message was created at or
// after ts, by binary search over the partition's offsets.
func (ac *applyCtx) firstAtOrAfter(tid uint32, pid uint64, p *partRec, ts int64) uint64 {
	if p.Next == p.First || p.LastTime < ts {
		return p.Next
	}
	lo, hi := p.First, p.Next
	for lo < hi {
		mid := lo + (hi-lo)/2
		v := ac.get(msgKey(tid, p.Queue, pid, mid))
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
func (ac *applyCtx) firstAfterIndex(tid uint32, pid uint64, p *partRec, idx uint64) uint64 {
	if p.Next == p.First || p.LastIdx <= idx {
		return p.Next
	}
	if p.CreatedIdx > idx {
		return p.First
	}
	lo, hi := p.First, p.Next
	for lo < hi {
		mid := lo + (hi-lo)/2
		v := ac.get(msgKey(tid, p.Queue, pid, mid))
		_, mi, ok := msgTimeIndex(v)
		if !ok || mi <= idx {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}
