package state

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// appendCursorV2 is the version 2 encoding of c (version 3 without the
// stamp), as builds before overlays wrote it.
func appendCursorV2(c *cursorRec) []byte {
	d := *c
	d.Stamp = 0
	b := d.appendTo(nil)
	b[0] = 2
	return b[:len(b)-1] // the stamp 0: one byte
}

// encodeLeaseV0 is a lease record as builds before overlays wrote it.
func encodeLeaseV0(hs []leaseHolder) []byte {
	b := binary.AppendUvarint(nil, uint64(len(hs)))
	var prev leaseHolder
	for _, h := range hs {
		b = binary.AppendUvarint(b, h.sub-prev.sub)
		if h.sub != prev.sub {
			prev.pid = 0
		}
		b = binary.AppendUvarint(b, h.pid-prev.pid)
		prev = h
	}
	return b
}

// rewriteAsOldStore rewrites the store as a build before overlays would
// have left it for the same commands: the cursor a pop did not write is
// written, naming its lease (its record with the overlay applied), every
// cursor record in the encoding enc gives (no stamp), and every lease
// record without overlays. It returns the cursor records written. The
// caller reopens the store.
func rewriteAsOldStore(t *testing.T, h *harness, enc func(*cursorRec) []byte) int {
	t.Helper()
	h.s.waitCommitted()
	h.s.cache = newRecordCache()
	ac := h.s.newApplyCtx(0)
	defer ac.b.Close()
	type kv struct{ k, v []byte }
	var out []kv
	folded := map[string]*cursorRec{}
	it, err := h.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tLeaseID}, UpperBound: []byte{tLeaseID + 1}})
	if err != nil {
		t.Fatal(err)
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != leaseRecKeyLen {
			continue
		}
		var id [16]byte
		copy(id[:], k[5:21])
		tid := binary.BigEndian.Uint32(k[1:5])
		hs, err := decodeLease(it.Value(), id)
		if err != nil {
			t.Fatalf("lease record %x: %v", k, err)
		}
		for _, lh := range hs {
			if lh.ov == nil {
				continue
			}
			qid := ac.partQueue(tid, lh.pid)
			s, p := ac.subByID(tid, qid, lh.sub), ac.part(tid, qid, lh.pid)
			if s == nil || p == nil {
				continue
			}
			if c := ac.cursor(tid, s, lh.pid, p); c.unwritten {
				folded[string(cursorKey(tid, lh.sub, lh.pid))] = c
			}
		}
		out = append(out, kv{slices.Clone(k), encodeLeaseV0(hs)})
	}
	it.Close()
	it, err = h.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tCursor}, UpperBound: []byte{tCursor + 1}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for it.First(); it.Valid(); it.Next() {
		c, err := decodeCursor(it.Value())
		if err != nil {
			t.Fatalf("cursor %x: %v", it.Key(), err)
		}
		if f := folded[string(it.Key())]; f != nil {
			c = f
			delete(folded, string(it.Key()))
		}
		out = append(out, kv{slices.Clone(it.Key()), enc(c)})
		n++
	}
	it.Close()
	for k, c := range folded {
		out = append(out, kv{[]byte(k), enc(c)})
		n++
	}
	for _, r := range out {
		if err := h.s.db.Set(r.k, r.v, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	h.s.cache = newRecordCache()
	return n
}

// logicalDump is the store's state as the state machine reads it: every
// cursor that has a record or an overlay as its fields with the overlay
// applied (not its stamp, nor which of the two holds it), a lease record as
// its holders, subscriptions decoded, and every other key as stored. A
// store rewritten as an older build would have left it (rewriteAsOldStore)
// reads the same as the store it was rewritten from.
func logicalDump(t *testing.T, h *harness) map[string]string {
	t.Helper()
	h.s.waitCommitted()
	saved := h.s.cache
	h.s.cache = newRecordCache()
	ac := h.s.newApplyCtx(0)
	defer func() {
		ac.b.Close()
		h.s.cache = saved
	}()
	it, err := h.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tMeta + 1}, UpperBound: []byte{tTableLimit}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	m := map[string]string{}
	curs := map[cursorRef]bool{}
	for it.First(); it.Valid(); it.Next() {
		k, v := it.Key(), it.Value()
		switch {
		case k[0] == tSub:
			s, err := decodeSub(v)
			if err != nil {
				t.Fatalf("subscription %x: %v", k, err)
			}
			m[string(k)] = fmt.Sprintf("%+v", *s)
		case k[0] == tCursor:
			curs[curRef(binary.BigEndian.Uint32(k[1:5]), binary.BigEndian.Uint64(k[5:13]), binary.BigEndian.Uint64(k[13:21]))] = true
		case k[0] == tLeaseID && len(k) == leaseRecKeyLen:
			var id [16]byte
			copy(id[:], k[5:21])
			hs, err := decodeLease(v, id)
			if err != nil {
				t.Fatalf("lease record %x: %v", k, err)
			}
			var ps [][2]uint64
			for _, lh := range hs {
				ps = append(ps, [2]uint64{lh.sub, lh.pid})
				if lh.ov != nil {
					curs[curRef(binary.BigEndian.Uint32(k[1:5]), lh.sub, lh.pid)] = true
				}
			}
			m[string(k)] = fmt.Sprint(ps)
		default:
			m[string(k)] = string(v)
		}
	}
	for ref := range curs {
		tid := uint32(ref.tid)
		k := string(cursorKey(tid, ref.sub, ref.pid))
		qid := ac.partQueue(tid, ref.pid)
		s, p := ac.subByID(tid, qid, ref.sub), ac.part(tid, qid, ref.pid)
		if s == nil || p == nil {
			if v := ac.get([]byte(k)); v != nil {
				c, err := decodeCursor(v)
				if err != nil {
					t.Fatalf("cursor %x: %v", k, err)
				}
				m[k] = fmt.Sprintf("%+v", cursorFields(c))
			}
			continue
		}
		c := ac.cursor(tid, s, ref.pid, p)
		if c.derived {
			continue // what no record stands for
		}
		m[k] = fmt.Sprintf("%+v", cursorFields(c))
	}
	return m
}

// cursorRecords counts the stored cursor records.
func cursorRecords(t *testing.T, h *harness) int {
	t.Helper()
	h.s.waitCommitted()
	return countKeys(t, h.s.db, tCursor, tCursor)
}

// leaseHolders decodes the stored lease record of lease (tenant 1).
func leaseHolders(t *testing.T, h *harness, lease string) []leaseHolder {
	t.Helper()
	h.s.waitCommitted()
	id, _ := parseLeaseID(lease)
	v, closer, err := h.s.db.Get(leaseRecKey(1, id))
	if err != nil {
		t.Fatalf("lease record of %s: %v", lease, err)
	}
	defer closer.Close()
	hs, err := decodeLease(v, id)
	if err != nil {
		t.Fatalf("lease record of %s: %v", lease, err)
	}
	return hs
}
