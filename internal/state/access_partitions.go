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
	nk := ac.keyBuf
	if id, ok := ac.partIDs[string(nk)]; ok {
		return id
	}
	if q != nil {
		if f := ac.partNames(tid, q); f != nil && !f.mayHold(name) {
			return 0
		}
	}
	var id uint64
	if v := ac.get(nk); len(v) == 8 {
		id = lastU64(v)
	}
	ac.partIDs[string(nk)] = id
	return id
}

func (ac *applyCtx) part(tid uint32, qid, pid uint64) *partRec {
	k := string(partKey(tid, qid, pid))
	if p, ok := ac.parts[k]; ok {
		return p
	}
	var p *partRec
	if v := ac.get([]byte(k)); v != nil {
		var err error
		if p, err = decodePart(v); err != nil {
			ac.corrupt([]byte(k), "partition", err)
			p = nil
		} else {
			completeTail(p, tid, pid, ac.iterRange)
		}
	}
	ac.parts[k] = p
	return p
}

// markPart records a change of a partition field other than its tail (a
// push's new messages change only the tail: see completeTail).
func (ac *applyCtx) markPart(tid uint32, pid uint64, p *partRec) {
	p.markTail()
	ac.dirty[string(partKey(tid, p.Queue, pid))] = p
}

// createPart creates a partition of q. The caller marks q dirty, and writes
// the new record through (writePart) once its first message is set.
func (ac *applyCtx) createPart(tid uint32, q *queueRec, name string) (uint64, *partRec) {
	pid := ac.m.NextPart
	ac.m.NextPart++
	p := &partRec{Queue: q.ID, CreatedAt: ac.now, CreatedIdx: ac.seq(), Name: name, born: ac.serial}
	ac.scratch = kb(append(ac.scratch[:0], tPartName)).u32(tid).u64(q.ID).str(name)
	nk := len(ac.scratch)
	ac.partIDs[string(ac.scratch)] = pid
	ac.notePartName(tid, q.ID, name)
	ac.scratch = binary.BigEndian.AppendUint64(ac.scratch, pid)
	ac.set(ac.scratch[:nk], ac.scratch[nk:])
	ac.scratch = kb(append(ac.scratch[:0], tPartLoc)).u32(tid).u64(pid)
	nk = len(ac.scratch)
	ac.scratch = binary.BigEndian.AppendUint64(ac.scratch, q.ID)
	ac.set(ac.scratch[:nk], ac.scratch[nk:])
	ac.partLocs[pid] = partLoc{tid: tid, qid: q.ID}
	p.key = string(partKey(tid, q.ID, pid))
	ac.parts[p.key] = p
	q.Partitions++
	return pid, p
}

// writePart writes a new partition record through at once, so that scans of
// the queue's partitions within the batch (backfill) see it; the record is
// also marked dirty. flush skips it when it has not changed since.
func (ac *applyCtx) writePart(tid uint32, pid uint64, p *partRec) {
	k := p.key
	p.key = ""
	if k == "" {
		k = string(partKey(tid, p.Queue, pid))
	}
	p.markTail()
	ac.dirty[k] = p
	p.wrote = p.encode()
	ac.set([]byte(k), p.wrote)
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
	if v := ac.get(partLocKey(tid, pid)); len(v) == 8 {
		qid := lastU64(v)
		ac.partLocs[pid] = partLoc{tid: tid, qid: qid}
		return qid
	}
	return 0
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
