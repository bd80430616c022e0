package state

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
	return c.appendTo(make([]byte, 0, 48+len(c.Ex)*14+len(c.LeaseOffs)*3))
}

// appendTo appends the encoding of c to b.
func (c *cursorRec) appendTo(b []byte) []byte {
	e := enc{b: b}
	e.u8(1)
	e.u64(c.Epoch)
	e.u64(c.Cursor)
	e.bool(c.Ready)
	e.uv(uint64(len(c.Ex)))
	for _, x := range c.Ex {
		e.uv(x.Off)
		e.u8(x.Flags)
		e.uv(uint64(x.Attempt))
		e.uv(uint64(x.Retries))
		e.uv(uint64(x.VisibleAt))
	}
	e.i64(c.LeaseExpires)
	if c.LeaseExpires != 0 {
		e.b = append(e.b, c.LeaseID[:]...)
		e.uv(uint64(len(c.LeaseOffs)))
		prev := uint64(0)
		for _, o := range c.LeaseOffs {
			e.uv(o - prev)
			prev = o
		}
	}
	return e.b
}

func decodeCursor(b []byte) (*cursorRec, error) {
	d := dec{b: b}
	if d.u8() != 1 {
		return nil, errCorrupt
	}
	c := &cursorRec{}
	c.Epoch = d.u64()
	c.Cursor = d.u64()
	c.Ready = d.bool()
	n := d.uv()
	if n > uint64(len(b)) {
		return nil, errCorrupt
	}
	c.Ex = make([]exception, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		var x exception
		x.Off = d.uv()
		x.Flags = d.u8()
		x.Attempt = uint32(d.uv())
		x.Retries = uint32(d.uv())
		x.VisibleAt = int64(d.uv())
		c.Ex = append(c.Ex, x)
	}
	c.LeaseExpires = d.i64()
	if c.LeaseExpires != 0 {
		if len(d.b) < 16 {
			return nil, errCorrupt
		}
		copy(c.LeaseID[:], d.b[:16])
		d.b = d.b[16:]
		m := d.uv()
		if m > uint64(len(b)) {
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
