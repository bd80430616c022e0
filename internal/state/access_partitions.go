package state

import (
	"encoding/binary"
)

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
