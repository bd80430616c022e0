package pgsource

import (
	"encoding/binary"
	"fmt"
)

// Kinds of a tuple's column, as pgoutput sends them.
const (
	colNull      = 'n'
	colUnchanged = 'u' // a TOASTed value the update left unchanged
	colText      = 't'
	colBinary    = 'b'
)

// tuple is one row: per column its kind and, for text, the bytes
// PostgreSQL printed. The slices point into the message (or the snapshot
// row) they were read from and are reused from row to row.
type tuple struct {
	kind []byte
	val  [][]byte
}

func (t *tuple) reset(n int) {
	if cap(t.kind) < n {
		t.kind = make([]byte, n)
		t.val = make([][]byte, n)
	}
	t.kind = t.kind[:n]
	t.val = t.val[:n]
}

func (t *tuple) present(i int) bool { return i < len(t.kind) && t.kind[i] == colText }

// decode reads pgoutput's TupleData at src and returns the bytes used.
func (t *tuple) decode(src []byte) (int, error) {
	if len(src) < 2 {
		return 0, fmt.Errorf("pgoutput tuple: %d bytes, want at least 2", len(src))
	}
	n := int(binary.BigEndian.Uint16(src))
	t.reset(n)
	off := 2
	for i := 0; i < n; i++ {
		if off >= len(src) {
			return 0, fmt.Errorf("pgoutput tuple: column %d of %d is missing", i, n)
		}
		k := src[off]
		off++
		t.kind[i] = k
		t.val[i] = nil
		switch k {
		case colNull, colUnchanged:
		case colText, colBinary:
			if off+4 > len(src) {
				return 0, fmt.Errorf("pgoutput tuple: column %d has no length", i)
			}
			l := int(binary.BigEndian.Uint32(src[off:]))
			off += 4
			if l < 0 || off+l > len(src) {
				return 0, fmt.Errorf("pgoutput tuple: column %d length %d overruns the message", i, l)
			}
			t.val[i] = src[off : off+l : off+l]
			off += l
		default:
			return 0, fmt.Errorf("pgoutput tuple: column %d has kind %q", i, k)
		}
	}
	return off, nil
}

// change is one decoded Insert, Update or Delete.
type change struct {
	op    byte // 'I', 'U', 'D'
	relID uint32
	// oldKind is 'K' (the old key), 'O' (the whole old row, REPLICA
	// IDENTITY FULL) or 0 when there is no old tuple.
	oldKind byte
	old     tuple
	new     tuple
}

// decodeChange reads an Insert, Update or Delete message of pgoutput
// protocol version 1 (the first byte is the message type).
func (c *change) decode(msg []byte) error {
	if len(msg) < 6 {
		return fmt.Errorf("pgoutput %q message of %d bytes", msg[0], len(msg))
	}
	c.op = msg[0]
	c.relID = binary.BigEndian.Uint32(msg[1:])
	c.oldKind = 0
	c.old.reset(0)
	c.new.reset(0)
	off := 5
	switch c.op {
	case 'I':
		if msg[off] != 'N' {
			return fmt.Errorf("pgoutput insert: tuple marker %q, want N", msg[off])
		}
		_, err := c.new.decode(msg[off+1:])
		return err
	case 'U':
		if msg[off] == 'K' || msg[off] == 'O' {
			c.oldKind = msg[off]
			n, err := c.old.decode(msg[off+1:])
			if err != nil {
				return err
			}
			off += 1 + n
		}
		if off >= len(msg) || msg[off] != 'N' {
			return fmt.Errorf("pgoutput update: no new tuple")
		}
		_, err := c.new.decode(msg[off+1:])
		return err
	case 'D':
		if msg[off] != 'K' && msg[off] != 'O' {
			return fmt.Errorf("pgoutput delete: tuple marker %q, want K or O", msg[off])
		}
		c.oldKind = msg[off]
		_, err := c.old.decode(msg[off+1:])
		return err
	}
	return fmt.Errorf("pgoutput: %q is not a row change", c.op)
}
