package state

import "encoding/binary"

// Flags of a cursor exception.
const (
	exDone     = 1 << 0 // finished (acked or dead-lettered)
	exRequeued = 1 << 1 // below the cursor, made available again
)

// exception is per-offset state that differs from what the cursor implies.
type exception struct {
	Off       uint64
	Flags     uint8
	Attempt   uint32 // deliveries so far
	Retries   uint32 // failed acks so far
	VisibleAt int64  // not deliverable before (retry delay)
}

// cursorRec is a group's position in one partition.
type cursorRec struct {
	Epoch        uint64
	Cursor       uint64
	Ready        bool        // the ready index holds this (group, partition)
	Ex           []exception // sorted by Off
	LeaseID      [16]byte
	LeaseExpires int64 // 0: no lease
	LeaseOffs    []uint64
	// Stamp is the log index of the last leasing pop folded into the
	// cursor (record version 3): the overlay a lease record carries for
	// this cursor applies only when its pop's index is above the stamp of
	// the stored record (leaseOverlay).
	Stamp uint64

	// unwritten says the cursor is its stored record with a lease
	// record's overlay applied: the last pop did not write it, and
	// nothing wrote it since. Memory only.
	unwritten bool

	// recent lists the transaction ids of the messages delivered by the
	// last lease with their offsets, so that acks (which name a message by
	// transaction id) find the offset without a lookup. Memory only, never
	// encoded: a cursor read back from Pebble has none, and its acks use the
	// dedup index. An entry stays right while its offset is retained.
	recent    []txOff
	recentPos int
	// derived marks a cursor computed from the start rule and not changed
	// since: it is not written (see cursorAt). Memory only.
	derived bool
}

type txOff struct {
	txid string
	off  uint64
}

// recentOffset finds a transaction id among the messages delivered last.
// Acks usually come in delivery order, so the search starts after the last
// hit.
func (c *cursorRec) recentOffset(txid string) (uint64, bool) {
	d, ok := c.findRecent(func(d txOff) bool { return d.txid == txid })
	return d.off, ok
}

// recentTxID finds the transaction id of an offset among the messages
// delivered last (acks naming a message by offset alone).
func (c *cursorRec) recentTxID(off uint64) (string, bool) {
	d, ok := c.findRecent(func(d txOff) bool { return d.off == off })
	return d.txid, ok
}

// findRecent searches the deliveries from just after the last hit, since
// acks usually come in delivery order.
func (c *cursorRec) findRecent(match func(txOff) bool) (txOff, bool) {
	n := len(c.recent)
	for i := 0; i < n; i++ {
		j := (c.recentPos + i) % n
		if match(c.recent[j]) {
			c.recentPos = j + 1
			return c.recent[j], true
		}
	}
	return txOff{}, false
}

func (c *cursorRec) encode() []byte {
	return c.appendTo(make([]byte, 0, 64))
}

// maxCursorEntries bounds the exceptions, and the lease's offsets, that a
// decoded cursor may expand to: a run of version 2 stands for any number
// of offsets, and a damaged record must not make the decoder allocate
// without bound. A cursor holds an exception per message delivered and not
// yet finished, or finished out of order, or requeued: a lease's batch,
// retries, dead letters above the cursor; far below this.
const maxCursorEntries = 1 << 24

// appendTo appends the encoding of c to b.
//
// Version 3 is version 2 followed by the stamp (a varint).
//
// Version 2 writes a run of consecutive offsets whose exceptions are equal
// but for the offset (a pop's deliveries: attempt 1, nothing else) as one
// entry, and the lease's offsets as runs of consecutive ones: a pop of 500
// from one partition writes a cursor of about 40 bytes instead of about
// 3,500, and the fixed fields are varints. Version 1 (one entry per
// exception and per leased offset) is still read; docs/design/state.md,
// "What a pop and an ack cost per message", says what older builds do with
// version 2.
func (c *cursorRec) appendTo(b []byte) []byte {
	e := enc{b: b}
	e.u8(3)
	e.uv(c.Epoch)
	e.uv(c.Cursor)
	e.bool(c.Ready)
	n := 0
	for i := range c.Ex {
		if i == 0 || !extends(&c.Ex[i-1], &c.Ex[i]) {
			n++
		}
	}
	e.uv(uint64(n))
	end := uint64(0) // one past the previous run
	for i := 0; i < len(c.Ex); {
		x := &c.Ex[i]
		j := i + 1
		for j < len(c.Ex) && extends(&c.Ex[j-1], &c.Ex[j]) {
			j++
		}
		e.b = binary.AppendVarint(e.b, int64(x.Off-end))
		e.uv(uint64(j - i - 1))
		e.u8(x.Flags)
		e.uv(uint64(x.Attempt))
		e.uv(uint64(x.Retries))
		e.uv(uint64(x.VisibleAt))
		end = x.Off + uint64(j-i)
		i = j
	}
	e.b = binary.AppendVarint(e.b, c.LeaseExpires)
	if c.LeaseExpires != 0 {
		e.b = append(e.b, c.LeaseID[:]...)
		e.b = appendOffsetRuns(e.b, c.LeaseOffs)
	}
	e.uv(c.Stamp)
	return e.b
}

// extends reports whether y continues x's run: the next offset, the same
// state.
func extends(x, y *exception) bool {
	return y.Off == x.Off+1 && y.Flags == x.Flags && y.Attempt == x.Attempt && y.Retries == x.Retries && y.VisibleAt == x.VisibleAt
}

// appendOffsetRuns appends offsets as runs of consecutive ones: the count
// of runs, then for each its start (from the previous run's end, signed:
// offsets are ascending, but out of order they are still written right)
// and its length less one.
func appendOffsetRuns(b []byte, offs []uint64) []byte {
	n := 0
	for i := range offs {
		if i == 0 || offs[i] != offs[i-1]+1 {
			n++
		}
	}
	b = binary.AppendUvarint(b, uint64(n))
	end := uint64(0)
	for i := 0; i < len(offs); {
		j := i + 1
		for j < len(offs) && offs[j] == offs[j-1]+1 {
			j++
		}
		b = binary.AppendVarint(b, int64(offs[i]-end))
		b = binary.AppendUvarint(b, uint64(j-i-1))
		end = offs[i] + uint64(j-i)
		i = j
	}
	return b
}

func decodeCursor(b []byte) (*cursorRec, error) {
	d := dec{b: b}
	switch d.u8() {
	case 1:
		return decodeCursorV1(d, len(b))
	case 2:
		return decodeCursorV2(d, len(b), false)
	case 3:
		return decodeCursorV2(d, len(b), true)
	}
	return nil, errCorrupt
}

// decodeCursorV1 decodes the rest of a version 1 record of size size.
func decodeCursorV1(d dec, size int) (*cursorRec, error) {
	c := &cursorRec{}
	c.Epoch = d.u64()
	c.Cursor = d.u64()
	c.Ready = d.bool()
	n := d.uv()
	if n > uint64(size) {
		return nil, errCorrupt
	}
	c.Ex = make([]exception, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		var x exception
		x.Off = d.uv()
		d.exState(&x)
		c.Ex = append(c.Ex, x)
	}
	c.LeaseExpires = d.i64()
	if c.LeaseExpires != 0 {
		m, ok := d.leaseHead(c, size)
		if !ok {
			return nil, errCorrupt
		}
		c.LeaseOffs = make([]uint64, 0, m)
		prev := uint64(0)
		for i := uint64(0); i < m && d.err == nil; i++ {
			prev += d.uv()
			c.LeaseOffs = append(c.LeaseOffs, prev)
		}
	}
	return c, d.err
}

// exState decodes an exception's state after its offset, the same in
// both versions.
func (d *dec) exState(x *exception) {
	x.Flags = d.u8()
	x.Attempt = uint32(d.uv())
	x.Retries = uint32(d.uv())
	x.VisibleAt = int64(d.uv())
}

// leaseHead decodes a lease's id into c and the count of its offset
// entries, which a record of size bytes bounds; false for a damaged one.
func (d *dec) leaseHead(c *cursorRec, size int) (uint64, bool) {
	if len(d.b) < 16 {
		return 0, false
	}
	copy(c.LeaseID[:], d.b[:16])
	d.b = d.b[16:]
	m := d.uv()
	return m, m <= uint64(size)
}

// exRun is a run of n consecutive offsets from off, as version 2 writes
// it, with the state its exceptions share (x.Off unset).
type exRun struct {
	off, n uint64
	x      exception
}

// run decodes a run's start and length; end is one past the previous
// run's, total the offsets of the runs before, both updated.
func (d *dec) run(end, total *uint64) (off, n uint64) {
	off = *end + uint64(d.sv())
	l := d.uv()
	if d.err != nil || l >= maxCursorEntries || *total+l+1 > maxCursorEntries {
		d.fail()
		return 0, 0
	}
	*total += l + 1
	*end = off + l + 1
	return off, l + 1
}

// decodeCursorV2 decodes the rest of a version 2 record of size size (see
// appendTo), or of version 3 when stamped. The runs are read before any
// exception is made, so that the bound on their total holds before the
// allocation of their size.
func decodeCursorV2(d dec, size int, stamped bool) (*cursorRec, error) {
	c := &cursorRec{}
	c.Epoch = d.uv()
	c.Cursor = d.uv()
	c.Ready = d.bool()
	n := d.uv()
	if n > uint64(size) {
		return nil, errCorrupt
	}
	var one [1]exRun // most cursors have one run or none
	rs := one[:0]
	if n > 1 {
		rs = make([]exRun, 0, n)
	}
	end, total := uint64(0), uint64(0)
	for i := uint64(0); i < n && d.err == nil; i++ {
		var r exRun
		r.off, r.n = d.run(&end, &total)
		d.exState(&r.x)
		rs = append(rs, r)
	}
	if d.err != nil {
		return nil, d.err
	}
	if total > 0 {
		c.Ex = make([]exception, 0, total)
	}
	for _, r := range rs {
		x := r.x
		for k := uint64(0); k < r.n; k++ {
			x.Off = r.off + k
			c.Ex = append(c.Ex, x)
		}
	}
	c.LeaseExpires = d.sv()
	if c.LeaseExpires != 0 {
		m, ok := d.leaseHead(c, size)
		if !ok {
			return nil, errCorrupt
		}
		// Two passes over the runs: the first checks their total.
		runs := d
		end, total = 0, 0
		for i := uint64(0); i < m && d.err == nil; i++ {
			d.run(&end, &total)
		}
		if d.err != nil {
			return nil, d.err
		}
		c.LeaseOffs = make([]uint64, 0, total)
		end, total = 0, 0
		for i := uint64(0); i < m; i++ {
			off, l := runs.run(&end, &total)
			for k := uint64(0); k < l; k++ {
				c.LeaseOffs = append(c.LeaseOffs, off+k)
			}
		}
	}
	if stamped {
		c.Stamp = d.uv()
	}
	if d.err == nil && len(d.b) != 0 {
		return nil, errCorrupt
	}
	return c, d.err
}

// search returns the index of the first exception at or above off.
func (c *cursorRec) search(off uint64) int {
	lo, hi := 0, len(c.Ex)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c.Ex[m].Off < off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// find returns the index of the exception for off, or -1.
func (c *cursorRec) find(off uint64) int {
	if n := len(c.Ex); n == 0 || c.Ex[n-1].Off < off {
		return -1 // past the last one (a new delivery)
	}
	i := c.search(off)
	if i < len(c.Ex) && c.Ex[i].Off == off {
		return i
	}
	return -1
}

// ex returns the exception for off, inserting a blank one if needed.
func (c *cursorRec) ex(off uint64) *exception {
	if n := len(c.Ex); n == 0 || c.Ex[n-1].Off < off {
		// Past the last one: deliveries come in offset order.
		c.Ex = append(c.Ex, exception{Off: off})
		return &c.Ex[n]
	}
	i := c.search(off)
	if i < len(c.Ex) && c.Ex[i].Off == off {
		return &c.Ex[i]
	}
	c.Ex = append(c.Ex, exception{})
	copy(c.Ex[i+1:], c.Ex[i:])
	c.Ex[i] = exception{Off: off}
	return &c.Ex[i]
}

// normalize advances the cursor over finished offsets and drops exceptions
// that carry no information, in one pass over the (sorted) exceptions.
func (c *cursorRec) normalize() {
	out := c.Ex[:0]
	for _, x := range c.Ex {
		switch {
		case x.Off < c.Cursor && x.Flags&exRequeued == 0:
		case x.Off == c.Cursor && x.Flags&exDone != 0:
			c.Cursor++
		default:
			out = append(out, x)
		}
	}
	c.Ex = out
}

// leased reports whether the record holds an unexpired lease at now.
func (c *cursorRec) leased(now int64) bool { return c.LeaseExpires != 0 && c.LeaseExpires > now }

func (c *cursorRec) clearLease() {
	c.LeaseExpires = 0
	c.LeaseID = [16]byte{}
	c.LeaseOffs = nil
}
