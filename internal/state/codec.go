package state

import (
	"encoding/binary"
	"errors"
	"strings"
	"unsafe"
)

// errCorrupt is returned by decoders on truncated or malformed input. Every
// decoder of bytes that can come from outside (commands) must return it rather
// than panic.
var errCorrupt = errors.New("corrupt encoding")

type enc struct{ b []byte }

func (e *enc) u8(v byte)    { e.b = append(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *enc) i64(v int64)  { e.b = binary.BigEndian.AppendUint64(e.b, uint64(v)) }
func (e *enc) uv(v uint64)  { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *enc) bytes(v []byte) { e.uv(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) str(v string)   { e.uv(uint64(len(v))); e.b = append(e.b, v...) }

// uvSize is the length of v as a uvarint; strSize that of a string or
// byte slice of length n with its length prefix.
func uvSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
func strSize(n int) int { return uvSize(uint64(n)) + n }

type dec struct {
	b   []byte
	err error
}

func (d *dec) fail() { d.err = errCorrupt; d.b = nil }

func (d *dec) u8() byte {
	if d.err != nil || len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}
func (d *dec) u32() uint32 {
	if d.err != nil || len(d.b) < 4 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}
func (d *dec) u64() uint64 {
	if d.err != nil || len(d.b) < 8 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}
func (d *dec) i64() int64 { return int64(d.u64()) }
func (d *dec) uv() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// sv reads a signed varint (binary.AppendVarint).
func (d *dec) sv() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) bool() bool { return d.u8() == 1 }

// bytes returns a sub-slice of the input (no copy).
func (d *dec) bytes() []byte {
	n := d.uv()
	if d.err != nil || uint64(len(d.b)) < n {
		d.fail()
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}
func (d *dec) str() string { return string(d.bytes()) }

// view is str sharing the input's memory, for an input never changed
// afterwards.
func (d *dec) view() string {
	b := d.bytes()
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// strArena makes the strings of one decoded command out of a few
// allocations, each sized for the strings still to come (decodePush), so
// that a command of many items does not allocate once per string. Its
// bytes are never written again once a string covers them. A string keeps
// its block alive, and so some of the command's other strings: all of them
// are read from the same command.
type strArena struct{ buf []byte }

// reserve makes room for need more bytes, allocating a block of want (at
// least need) if there is not.
func (a *strArena) reserve(need, want int) {
	if need > cap(a.buf)-len(a.buf) {
		a.buf = make([]byte, 0, max(need, want))
	}
}

// keep returns a copy of s from the arena, which allocates blocks of
// chunk bytes as it fills (a string over an eighth of that gets its own).
// The cached records of new partitions keep their names and first ids so:
// one block is shared by records created together, and no record keeps
// the command it was decoded from alive.
func (a *strArena) keep(s string, chunk int) string {
	if len(s) > cap(a.buf)-len(a.buf) {
		if len(s) > chunk/8 {
			return strings.Clone(s)
		}
		a.buf = make([]byte, 0, chunk)
	}
	return a.str(unsafe.Slice(unsafe.StringData(s), len(s)))
}

// str returns a string of b's bytes, from the arena while it has room.
func (a *strArena) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > cap(a.buf)-len(a.buf) {
		return string(b)
	}
	start := len(a.buf)
	a.buf = append(a.buf, b...)
	s := a.buf[start:len(a.buf):len(a.buf)]
	return unsafe.String(unsafe.SliceData(s), len(s))
}
