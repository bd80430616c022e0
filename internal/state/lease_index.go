package state

import (
	"bytes"
	"encoding/binary"
	"slices"
)

// The lease index finds the partitions a lease holds (to extend it, and for
// transactions that name it) and the leases that are due (Tick). A pop
// writes one lease record for all the partitions it leases, keyed by
// (tenant, lease id), listing its (group, partition) holders, and one due
// key at the lease's expiry: two keys per pop, where one key of each kind
// per leased partition (leaseIDKey, leaseExpKey) made a pop over a hundred
// partitions write four hundred index keys and its ack delete them again.
// Those per-partition keys are still read, for leases taken before.
//
// The cursor stays what says who holds a partition: a holder listed in the
// record holds the lease only while its cursor names the lease (acks,
// expiries and seeks change the cursor and leave the record). A pop that
// does not write the cursor puts what it changed in it into the record
// (the holder's overlay, lease_overlay.go), and the cursor read from the
// store is its record with that overlay applied. The record is
// deleted with its due key once no holder holds it: the cache keeps, per
// record, how many holders do (derived from the cursors when the record is
// loaded, so it is the same on every replica whatever each one cached), and
// ends the record when the count reaches zero. A record that outlives its
// holders some other way (a seek, a deleted group) is deleted by Tick when
// its due key comes.

// leaseRef names a lease record.
type leaseRef struct {
	tid uint32
	id  [16]byte
}

// leaseHolder is one (group, partition) a lease was taken on. ov is what
// the pop changed in the holder's cursor when it did not write the cursor
// (nil: the cursor's record names the lease, as every holder's did before
// overlays, and as a pop that wrote the cursor leaves it).
type leaseHolder struct {
	sub, pid uint64
	ov       *leaseOverlay
}

func cmpHolder(a, b leaseHolder) int {
	if a.sub != b.sub {
		if a.sub < b.sub {
			return -1
		}
		return 1
	}
	switch {
	case a.pid < b.pid:
		return -1
	case a.pid > b.pid:
		return 1
	}
	return 0
}

// leaseRec is a decoded lease record. held and due are memory only.
type leaseRec struct {
	holders []leaseHolder // sorted, no duplicates
	held    int           // holders whose cursor holds the lease
	due     int64         // the due key this store last wrote for it (0: none known)
	dirty   bool          // holders added by the running command
	gone    bool          // deleted by the running command
}

func (r *leaseRec) find(h leaseHolder) (int, bool) {
	if n := len(r.holders); n > 0 && cmpHolder(r.holders[n-1], h) < 0 {
		return n, false
	}
	return slices.BinarySearchFunc(r.holders, h, cmpHolder)
}

// leaseRecKey is the record's key: the lease id prefix under which the
// older per-partition keys sort (leaseIDPrefix), shorter than all of them.
func leaseRecKey(t uint32, id [16]byte) []byte { return leaseIDPrefix(t, id) }

// leaseDueKey is a lease's due key in the time index of lease expiries,
// one byte longer than a per-partition expiry key (leaseExpKey) so that
// Tick tells the two apart.
func leaseDueKey(at int64, t uint32, id [16]byte) []byte {
	return append(newKey(tLeaseExp, 29).i64(at).u32(t).raw(id[:]), 0)
}

const leaseDueKeyLen = 30

// leaseDueParts decodes a due key.
func leaseDueParts(k []byte) (at int64, t uint32, id [16]byte, ok bool) {
	if len(k) != leaseDueKeyLen {
		return 0, 0, id, false
	}
	at = int64(binary.BigEndian.Uint64(k[1:9]))
	t = binary.BigEndian.Uint32(k[9:13])
	copy(id[:], k[13:29])
	return at, t, id, true
}

// encodeLease encodes holders (format 1): a 0 byte (a record of before
// overlays starts with its holder count, never 0), their count, then for
// each its group id and partition id as deltas from the holder before (the
// partition's absolute when the group changes), its flags and, with
// leaseOvOn, its overlay: with leaseOvHead the pop's log index, the
// cursor's epoch and the expiry (otherwise those of the overlay before),
// then the runs of offsets leased, each its start (signed, from the end of
// the run before), its length less one and the attempt of its offsets.
func encodeLease(b []byte, hs []leaseHolder) []byte {
	b = append(b, 0)
	b = binary.AppendUvarint(b, uint64(len(hs)))
	var prev leaseHolder
	var head *leaseOverlay
	for _, h := range hs {
		b = binary.AppendUvarint(b, h.sub-prev.sub)
		if h.sub != prev.sub {
			prev.pid = 0
		}
		b = binary.AppendUvarint(b, h.pid-prev.pid)
		prev = h
		ov := h.ov
		if ov == nil {
			b = append(b, 0)
			continue
		}
		fl := byte(leaseOvOn)
		if head == nil || head.index != ov.index || head.epoch != ov.epoch || head.exp != ov.exp {
			fl |= leaseOvHead
		}
		b = append(b, fl)
		if fl&leaseOvHead != 0 {
			b = binary.AppendUvarint(b, ov.index)
			b = binary.AppendUvarint(b, ov.epoch)
			b = binary.AppendVarint(b, ov.exp)
			head = ov
		}
		b = binary.AppendUvarint(b, uint64(len(ov.runs)))
		end := uint64(0)
		for _, r := range ov.runs {
			b = binary.AppendVarint(b, int64(r.off-end))
			b = binary.AppendUvarint(b, r.n-1)
			b = binary.AppendUvarint(b, uint64(r.attempt))
			end = r.off + r.n
		}
	}
	return b
}

// Flags of a holder in a lease record of format 1.
const (
	leaseOvOn   = 1 << 0 // an overlay follows
	leaseOvHead = 1 << 1 // with its index, epoch and expiry
)

// decodeLease decodes a lease record of either format; id is the lease's
// (the overlays name it).
func decodeLease(v []byte, id [16]byte) ([]leaseHolder, error) {
	d := dec{b: v}
	overlays := len(v) > 0 && v[0] == 0
	if overlays {
		d.b = d.b[1:]
	}
	n := d.uv()
	if d.err != nil || n > uint64(len(v)) {
		return nil, errCorrupt
	}
	hs := make([]leaseHolder, 0, n)
	var prev leaseHolder
	var head *leaseOverlay
	for i := uint64(0); i < n; i++ {
		h := leaseHolder{sub: prev.sub + d.uv()}
		if h.sub != prev.sub {
			prev.pid = 0
		}
		h.pid = prev.pid + d.uv()
		if overlays {
			fl := d.u8()
			switch {
			case fl&^(leaseOvOn|leaseOvHead) != 0, fl == leaseOvHead:
				d.fail()
			case fl&leaseOvOn != 0:
				ov := &leaseOverlay{id: id}
				if fl&leaseOvHead != 0 {
					ov.index, ov.epoch, ov.exp = d.uv(), d.uv(), d.sv()
					head = ov
				} else if head != nil {
					ov.index, ov.epoch, ov.exp = head.index, head.epoch, head.exp
				} else {
					d.fail()
				}
				m := d.uv()
				if m == 0 || m > uint64(len(v)) {
					d.fail()
				}
				ov.runs = ov.one[:0]
				end, total := uint64(0), uint64(0)
				for j := uint64(0); j < m && d.err == nil; j++ {
					off, l := d.run(&end, &total)
					ov.runs = append(ov.runs, attRun{off: off, n: l, attempt: uint32(d.uv())})
				}
				h.ov = ov
			}
		}
		if d.err != nil {
			return nil, d.err
		}
		if i > 0 && cmpHolder(hs[i-1], h) >= 0 {
			return nil, errCorrupt
		}
		hs = append(hs, h)
		prev = h
	}
	if len(d.b) != 0 {
		return nil, errCorrupt
	}
	return hs, nil
}

// leaseRecord returns the lease record of id (nil: none), loading it and
// counting the holders whose cursors hold the lease on first use.
func (ac *applyCtx) leaseRecord(tid uint32, id [16]byte) *leaseRec {
	ref := leaseRef{tid, id}
	if r, ok := ac.leases[ref]; ok {
		return r
	}
	var r *leaseRec
	k := leaseRecKey(tid, id)
	if v := ac.get(k); v != nil {
		hs, err := decodeLease(v, id)
		if err != nil {
			ac.corrupt(k, "lease", err)
		} else {
			r = &leaseRec{holders: hs}
			for _, h := range hs {
				if ac.holdsLease(tid, id, h) {
					r.held++
				}
			}
		}
	}
	ac.leases[ref] = r
	return r
}

// holdsLease reports whether holder h's cursor holds lease id. It only
// looks (the cached cursor, or the stored record with its overlay, never
// caching it), so that loading a lease record changes nothing another
// replica, which had the record cached, would not change too. It decides
// as cursorAt would.
func (ac *applyCtx) holdsLease(tid uint32, id [16]byte, h leaseHolder) bool {
	qid := ac.partQueue(tid, h.pid)
	s := ac.subByID(tid, qid, h.sub)
	if s == nil {
		return false
	}
	ref := curRef(tid, h.sub, h.pid)
	c, ok := ac.cursors[ref]
	if !ok && ac.isSettled(ref) {
		return false // a settled cursor holds no lease
	}
	if !ok {
		k := cursorKey(tid, h.sub, h.pid)
		if v := ac.get(k); v != nil {
			var err error
			if c, err = decodeCursor(v); err != nil {
				ac.corrupt(k, "cursor", err)
				return false
			}
		}
	}
	if c == nil || c.Epoch != s.Epoch || !ok {
		// Read from the store, or derived: the overlay may hold.
		stamp := uint64(0)
		if c != nil && c.Epoch == s.Epoch {
			stamp = c.Stamp
		}
		if ov := ac.leaseIdx()[ref]; ov.appliesTo(s.Epoch, stamp) {
			return ov.id == id
		}
	}
	return c != nil && c.Epoch == s.Epoch && c.LeaseExpires != 0 && c.LeaseID == id
}

// takeLease records that the running pop leases (group, partition) under id
// until at; ov is what the pop changed in the cursor when it does not write
// it (nil when it does). The caller sets the cursor's lease; the record is
// written when the pop ends (flushLeases).
func (ac *applyCtx) takeLease(tid uint32, id [16]byte, sub, pid uint64, at int64, ov *leaseOverlay) {
	idx := ac.leaseIdx()
	var r *leaseRec
	if bytes.Compare(id[:], ac.lidx.high[:]) > 0 {
		// Above every lease id the lease table holds: a new lease, whose
		// record no read would find (a pop's lease id is a new UUIDv7 of
		// the node that received it, so this is the usual case). Every
		// replica reaches the same record with or without the read, so
		// skipping it changes no result.
		ac.lidx.high = id
		ac.leases[leaseRef{tid, id}] = nil
	} else {
		r = ac.leaseRecord(tid, id)
	}
	if r == nil {
		r = &leaseRec{}
		ac.leases[leaseRef{tid, id}] = r
	}
	h := leaseHolder{sub: sub, pid: pid, ov: ov}
	if i, found := r.find(h); !found {
		r.holders = slices.Insert(r.holders, i, h)
	} else {
		r.holders[i].ov = ov
	}
	ref := curRef(tid, sub, pid)
	if ov != nil {
		idx[ref] = ov
	} else {
		delete(idx, ref)
	}
	r.held++
	if !r.dirty {
		r.dirty = true
		ac.leaseDirty = append(ac.leaseDirty, leaseRef{tid, id})
	}
	if r.due != at {
		ac.set(leaseDueKey(at, tid, id), nil)
		ac.schedule(at)
		r.due = at
	}
}

// flushLeases writes the lease records the running command added holders to.
func (ac *applyCtx) flushLeases() {
	for _, ref := range ac.leaseDirty {
		r := ac.leases[ref]
		if r == nil || r.gone || !r.dirty {
			continue
		}
		r.dirty = false
		ac.scratch = encodeLease(ac.scratch[:0], r.holders)
		ac.set(leaseRecKey(ref.tid, ref.id), ac.scratch)
	}
	ac.leaseDirty = ac.leaseDirty[:0]
}

// releaseLeaseIndex takes a cursor that is about to lose its lease out of
// the lease index: from the lease's record, deleted with its due key once
// no holder is left, or, for a lease taken before records, its own keys.
func (ac *applyCtx) releaseLeaseIndex(tid uint32, sub, pid uint64, cur *cursorRec) {
	if r := ac.leaseRecord(tid, cur.LeaseID); r != nil {
		if _, found := r.find(leaseHolder{sub: sub, pid: pid}); found {
			r.held--
			if r.held <= 0 {
				ac.endLeaseRecord(tid, cur.LeaseID, r)
				ac.del(leaseDueKey(cur.LeaseExpires, tid, cur.LeaseID))
			}
			return
		}
	}
	ac.del(leaseExpKey(cur.LeaseExpires, tid, sub, pid))
	ac.del(leaseIDKey(tid, cur.LeaseID, sub, pid))
}

// endLeaseRecord deletes a lease record, and its holders' overlays from
// the lease index.
func (ac *applyCtx) endLeaseRecord(tid uint32, id [16]byte, r *leaseRec) {
	idx := ac.leaseIdx()
	for _, h := range r.holders {
		ref := curRef(tid, h.sub, h.pid)
		if ov := idx[ref]; ov != nil && ov.id == id {
			delete(idx, ref)
		}
	}
	r.gone = true
	ac.del(leaseRecKey(tid, id))
	ac.leases[leaseRef{tid, id}] = nil
}

// forgetLeases drops the cached lease records: a command that changes
// cursors other than one by one (a seek, a deleted group) changes their
// holder counts, which loading them again recounts.
func (ac *applyCtx) forgetLeases() {
	ac.flushLeases()
	clear(ac.leases)
}

// leaseHold is a (group, partition) found under a lease id; old says it was
// found by a per-partition key rather than in a lease record.
type leaseHold struct {
	sub, pid uint64
	old      bool
}

// leaseHolds lists what lease id was taken on: the holders of its record
// and the partitions of its per-partition keys. Whether each still holds
// it is for its cursor to say.
func (ac *applyCtx) leaseHolds(tid uint32, id [16]byte) []leaseHold {
	var out []leaseHold
	if r := ac.leaseRecord(tid, id); r != nil {
		for _, h := range r.holders {
			out = append(out, leaseHold{sub: h.sub, pid: h.pid})
		}
	}
	it := ac.iter(leaseIDPrefix(tid, id))
	if it == nil {
		return out
	}
	for it.First(); it.Valid(); it.Next() {
		if k := it.Key(); len(k) == 37 {
			out = append(out, leaseHold{sub: lastU64(k[:29]), pid: lastU64(k), old: true})
		}
	}
	ac.closeIter(it)
	return out
}

// heldCursor is the cursor of subscription sub on partition pid, with its
// queue, partition and subscription records, when lease id holds it (with
// an expiry); false when one of them is gone or another lease, or none,
// holds the partition.
func (ac *applyCtx) heldCursor(tid uint32, sub, pid uint64, id [16]byte) (*queueRec, *partRec, *subRec, *cursorRec, bool) {
	qid := ac.partQueue(tid, pid)
	q := ac.queue(tid, qid)
	p := ac.part(tid, qid, pid)
	s := ac.subByID(tid, qid, sub)
	if q == nil || p == nil || s == nil {
		return nil, nil, nil, nil, false
	}
	cur := ac.cursor(tid, s, pid, p)
	if cur.LeaseID != id || cur.LeaseExpires == 0 {
		return nil, nil, nil, nil, false
	}
	return q, p, s, cur, true
}

// tickLease handles a due lease key: the holders whose lease has passed
// lose it (and become ready when they have work), and a record that no
// holder holds any more is deleted. It returns how many holders it expired.
func (ac *applyCtx) tickLease(tid uint32, id [16]byte) int {
	r := ac.leaseRecord(tid, id)
	if r == nil {
		return 0
	}
	n := 0
	for _, h := range slices.Clone(r.holders) {
		q, p, s, cur, ok := ac.heldCursor(tid, h.sub, h.pid, id)
		if !ok || cur.LeaseExpires > ac.now {
			continue
		}
		ac.expireLease(tid, s, h.pid, cur)
		if hasWork(cur, p) {
			ac.setReady(tid, s, h.pid, cur)
			ac.wake(tid, q.Name)
		}
		n++
	}
	if r = ac.leases[leaseRef{tid, id}]; r != nil && r.held <= 0 {
		ac.endLeaseRecord(tid, id, r)
	}
	return n
}
