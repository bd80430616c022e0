package state

import (
	"bytes"

	"github.com/cockroachdb/pebble/v2"
)

// A pop that leases a partition and changes its cursor in no other way does
// not write the cursor: the pop's lease record carries, per holder, what the
// pop changed (leaseOverlay), and whoever reads the cursor from the store
// applies it. The cursor is written by whatever changes it next (an ack, an
// expiry, an extension, retention), and that write includes the overlay,
// so the overlay applies only while its pop's log index is above the
// cursor record's stamp (cursorRec.Stamp), and only in the group's epoch
// at the pop (a seek raises the epoch without touching lease records).
// docs/design/state.md, "A pop that does not write the cursor".

// attRun is n consecutive offsets from off, each delivered attempt times.
type attRun struct {
	off, n  uint64
	attempt uint32
}

// leaseOverlay is what a pop that did not write a cursor changed in it,
// absolute, so that applying it twice gives the same cursor: the offsets it
// leased with their attempts after the pop (whose VisibleAt it set to 0,
// leaving their flags and retries), the lease, and Ready false.
type leaseOverlay struct {
	id    [16]byte
	index uint64 // the pop's log index
	epoch uint64 // the group's epoch at the pop
	exp   int64
	runs  []attRun
	one   [1]attRun // runs' storage when there is one
}

// newOverlay describes what the running pop did to c: its leased offsets
// (in delivery order, ascending) with their attempts.
func newOverlay(c *cursorRec, id [16]byte, index, epoch uint64, exp int64) *leaseOverlay {
	ov := &leaseOverlay{id: id, index: index, epoch: epoch, exp: exp}
	ov.runs = ov.one[:0]
	j := 0 // the exceptions and the leased offsets are both ascending
	for _, off := range c.LeaseOffs {
		for j < len(c.Ex) && c.Ex[j].Off < off {
			j++
		}
		if j == len(c.Ex) || c.Ex[j].Off != off {
			j = max(c.find(off), 0) // out of order: searched
		}
		var a uint32
		if j < len(c.Ex) && c.Ex[j].Off == off {
			a = c.Ex[j].Attempt
		}
		if n := len(ov.runs); n > 0 {
			if r := &ov.runs[n-1]; r.off+r.n == off && r.attempt == a {
				r.n++
				continue
			}
		}
		ov.runs = append(ov.runs, attRun{off: off, n: 1, attempt: a})
	}
	return ov
}

// appliesTo reports whether the overlay changes a cursor read from the
// store in group epoch epoch whose record carries stamp (0: no record of
// the epoch).
func (ov *leaseOverlay) appliesTo(epoch, stamp uint64) bool {
	return ov != nil && ov.epoch == epoch && ov.index > stamp
}

// apply makes c, read from the store, what the pop left in memory.
func (ov *leaseOverlay) apply(c *cursorRec) {
	c.LeaseOffs = c.LeaseOffs[:0]
	for _, r := range ov.runs {
		for k := uint64(0); k < r.n; k++ {
			x := c.ex(r.off + k)
			x.Attempt = r.attempt
			x.VisibleAt = 0
			c.LeaseOffs = append(c.LeaseOffs, r.off+k)
		}
	}
	c.LeaseID, c.LeaseExpires = ov.id, ov.exp
	c.Ready = false
	c.Stamp = ov.index
	c.derived = false
	c.unwritten = true
}

// overlayIndex is the (group, partition) -> overlay index of every holder of
// every stored lease record that carries one (the newest pop's when several
// records list a holder). It is derived from the stored lease records only
// (one scan, on first use after the cache is made), and kept by the apply,
// so every replica's is the same where it matters: an overlay that a newer
// write of the cursor folded in is ignored (appliesTo) wherever it lingers.
type overlayIndex struct {
	m      map[cursorRef]*leaseOverlay
	loaded bool
	// high is at least every lease id a key of the lease table holds:
	// the highest when the index was loaded, raised by every lease taken
	// since (takeLease). A pop's lease id above it has no record to read.
	high [16]byte
}

// leaseIdx returns the lease index, loading it on first use.
func (ac *applyCtx) leaseIdx() map[cursorRef]*leaseOverlay {
	li := ac.lidx
	if li.loaded {
		return li.m
	}
	li.loaded = true
	it := ac.iterRange([]byte{tLeaseID}, []byte{tLeaseID + 1})
	if it == nil {
		return li.m
	}
	li.high = loadOverlays(it, li.m, func(k []byte, err error) { ac.corrupt(k, "lease", err) })
	if err := it.Error(); err != nil {
		ac.fail(append([]byte(nil), it.Key()...), "scan", err)
	}
	ac.closeIter(it)
	return li.m
}

// loadOverlays puts the overlays of the lease records it iterates over into
// m (the newest per holder). It returns the highest lease id of the keys,
// the older per-partition ones included.
func loadOverlays(it *pebble.Iterator, m map[cursorRef]*leaseOverlay, bad func([]byte, error)) (high [16]byte) {
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) >= leaseRecKeyLen && bytes.Compare(k[5:21], high[:]) > 0 {
			copy(high[:], k[5:21])
		}
		if len(k) != leaseRecKeyLen {
			continue // a lease id key of before lease records
		}
		var id [16]byte
		copy(id[:], k[5:21])
		tid := uint32(k[1])<<24 | uint32(k[2])<<16 | uint32(k[3])<<8 | uint32(k[4])
		hs, err := decodeLease(it.Value(), id)
		if err != nil {
			bad(append([]byte(nil), k...), err)
			continue
		}
		for _, h := range hs {
			if h.ov == nil {
				continue
			}
			ref := curRef(tid, h.sub, h.pid)
			if o := m[ref]; o == nil || o.index < h.ov.index {
				m[ref] = h.ov
			}
		}
	}
	return high
}

const leaseRecKeyLen = 21

// overlay applies to c, a cursor of group s in partition pid just read
// from the store (its record, or derived when it has none in the group's
// epoch), the overlay that holds for it, if any.
func (ac *applyCtx) overlay(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	if ov := ac.leaseIdx()[curRef(tid, s.ID, pid)]; ov.appliesTo(s.Epoch, c.Stamp) {
		ov.apply(c)
	}
}

// captureCursor notes the cursor ref as it is now for the flush to write,
// whatever the running pop does to it next: a pop that does not write the
// cursor must leave the stored record as the commands before it left it,
// in whichever batch those ran (replicas batch the log differently).
func (ac *applyCtx) captureCursor(ref cursorRef, c *cursorRec) {
	delete(ac.dirtyCur, ref)
	if p, _ := ac.parts.get(ref.pid); p != nil {
		p.noCursor = false // a record is written (markCursor says so too)
	}
	start := len(ac.capBuf)
	ac.capBuf = c.appendTo(ac.capBuf)
	ac.capCur[ref] = ac.capBuf[start:len(ac.capBuf):len(ac.capBuf)]
}
