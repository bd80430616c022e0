package pgsource

import (
	"bytes"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// column is one column of a relation, in the order tuples carry them.
type column struct {
	name     string
	nameJSON []byte // `"name"`
	oid      uint32
}

// relation is one source table as tuples carry it: its columns in tuple
// order, which of them form the key and the partition, and where its
// messages go.
type relation struct {
	id       uint32
	name     string // schema.name
	nameJSON []byte
	queue    string
	cols     []column
	key      []int // indexes into cols
	part     []int // the partition's columns; nil with single
	single   bool
}

// newRelation builds a relation from its columns (name and type OID, in
// tuple order), its key columns and its partitionBy columns (nil for the
// key; single for one partition). Unknown names are an error.
func newRelation(id uint32, name, queue string, names []string, oids []uint32, key, partitionBy []string, single bool) (*relation, error) {
	r := &relation{id: id, name: name, nameJSON: appendStringS(nil, name), queue: queue, single: single}
	idx := make(map[string]int, len(names))
	for i, n := range names {
		r.cols = append(r.cols, column{name: n, nameJSON: appendStringS(nil, n), oid: oids[i]})
		idx[n] = i
	}
	find := func(list []string) ([]int, error) {
		out := make([]int, 0, len(list))
		for _, n := range list {
			i, ok := idx[n]
			if !ok {
				return nil, &missingColumnError{table: name, column: n}
			}
			out = append(out, i)
		}
		return out, nil
	}
	var err error
	if r.key, err = find(key); err != nil {
		return nil, err
	}
	if !single {
		if len(partitionBy) == 0 {
			r.part = r.key
		} else if r.part, err = find(partitionBy); err != nil {
			return nil, err
		}
	}
	return r, nil
}

type missingColumnError struct{ table, column string }

func (e *missingColumnError) Error() string {
	return "table " + e.table + " has no column " + strconv.Quote(e.column)
}

// meta is what every event of one transaction (or chunk) shares, already
// in JSON: "lsn", "xid" (nil for a snapshot row) and "ts".
type meta struct {
	lsn []byte
	xid []byte
	ts  []byte
}

// encoder writes change events. Its scratch buffers are reused from event
// to event; the events themselves are appended to the caller's buffer.
type encoder struct {
	part      []byte
	unchanged []int
	// idPrefix is the start of the snapshot ids for idEpoch and idPos.
	idPrefix []byte
	idEpoch  string
	idPos    pglogrepl.LSN
}

// Options of one event.
type eventArgs struct {
	op  byte // 'c', 'u', 'd', 'r', 't'
	rel *relation
	// keyFrom holds the key columns (the new row, or the old one for a
	// delete).
	keyFrom *tuple
	// after is the new row (nil for d and t).
	after *tuple
	// fill supplies values of after's unchanged columns (the old row
	// under REPLICA IDENTITY FULL, or values read back from the table).
	fill *tuple
	// before is the old row; beforeKeyOnly writes only its key columns.
	before        *tuple
	beforeKeyOnly bool
	// onlyCols, when set, limits after to these columns and lists every
	// other column in unchanged (a fill event).
	onlyCols []int
	seq      int
}

// appendEvent appends one event's JSON.
func (e *encoder) appendEvent(buf []byte, a *eventArgs, m *meta) []byte {
	rel := a.rel
	buf = append(buf, `{"op":"`...)
	buf = append(buf, a.op)
	buf = append(buf, `","table":`...)
	buf = append(buf, rel.nameJSON...)
	buf = append(buf, `,"key":`...)
	if a.keyFrom == nil {
		buf = append(buf, "null"...)
	} else {
		buf = e.appendCols(buf, rel, a.keyFrom, rel.key)
	}
	buf = append(buf, `,"after":`...)
	e.unchanged = e.unchanged[:0]
	if a.after == nil {
		buf = append(buf, "null"...)
	} else {
		buf = e.appendAfter(buf, rel, a)
	}
	buf = append(buf, `,"before":`...)
	switch {
	case a.before == nil:
		buf = append(buf, "null"...)
	case a.beforeKeyOnly:
		buf = e.appendCols(buf, rel, a.before, rel.key)
	default:
		buf = e.appendCols(buf, rel, a.before, nil)
	}
	if len(e.unchanged) > 0 {
		buf = append(buf, `,"unchanged":[`...)
		for i, c := range e.unchanged {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, rel.cols[c].nameJSON...)
		}
		buf = append(buf, ']')
	}
	buf = append(buf, `,"lsn":`...)
	buf = append(buf, m.lsn...)
	if m.xid != nil {
		buf = append(buf, `,"xid":`...)
		buf = append(buf, m.xid...)
	}
	buf = append(buf, `,"ts":`...)
	buf = append(buf, m.ts...)
	buf = append(buf, `,"seq":`...)
	buf = strconv.AppendInt(buf, int64(a.seq), 10)
	return append(buf, '}')
}

// appendCols writes an object of t's columns: those of only (all when
// nil). Columns t does not carry (null in a key-only old tuple that are not
// key columns, unchanged TOAST) are left out.
func (e *encoder) appendCols(buf []byte, rel *relation, t *tuple, only []int) []byte {
	buf = append(buf, '{')
	first := true
	write := func(i int) {
		if i >= len(t.kind) || t.kind[i] == colUnchanged {
			return
		}
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = append(buf, rel.cols[i].nameJSON...)
		buf = append(buf, ':')
		buf = appendTupleValue(buf, rel.cols[i].oid, t, i)
	}
	if only != nil {
		for _, i := range only {
			write(i)
		}
	} else {
		for i := range rel.cols {
			write(i)
		}
	}
	return append(buf, '}')
}

// appendAfter writes the new row, taking unchanged columns from a.fill
// when it has them, and records the rest in e.unchanged.
func (e *encoder) appendAfter(buf []byte, rel *relation, a *eventArgs) []byte {
	t := a.after
	buf = append(buf, '{')
	first := true
	for i := range rel.cols {
		if a.onlyCols != nil && !contains(a.onlyCols, i) {
			e.unchanged = append(e.unchanged, i)
			continue
		}
		src := t
		if i >= len(t.kind) || t.kind[i] == colUnchanged {
			if a.fill != nil && i < len(a.fill.kind) && (a.fill.kind[i] == colText || a.fill.kind[i] == colNull) {
				src = a.fill
			} else {
				e.unchanged = append(e.unchanged, i)
				continue
			}
		}
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = append(buf, rel.cols[i].nameJSON...)
		buf = append(buf, ':')
		buf = appendTupleValue(buf, rel.cols[i].oid, src, i)
	}
	return append(buf, '}')
}

func contains(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// appendTupleValue writes column i of t: null, or its converted value.
func appendTupleValue(buf []byte, oid uint32, t *tuple, i int) []byte {
	switch t.kind[i] {
	case colText:
		return appendValue(buf, oid, t.val[i])
	case colBinary:
		// pgoutput sends text unless binary was asked for; it never is.
		return appendString(buf, t.val[i])
	}
	return append(buf, "null"...)
}

// partition names the partition of a row (the new row, or the old one for
// a delete).
func (e *encoder) partition(rel *relation, t *tuple) string {
	if rel.single {
		return singlePartition
	}
	e.part = e.part[:0]
	composite := len(rel.part) > 1
	for n, i := range rel.part {
		if n > 0 {
			e.part = append(e.part, '|')
		}
		present := i < len(t.kind) && t.kind[i] == colText
		e.part = appendPartitionValue(e.part, valueAt(t, i), !present, composite)
	}
	return partitionName(e.part)
}

func valueAt(t *tuple, i int) []byte {
	if i < len(t.val) {
		return t.val[i]
	}
	return nil
}

// sameKey reports whether a and b carry the same key values.
func sameKey(rel *relation, a, b *tuple) bool {
	for _, i := range rel.key {
		if i >= len(a.kind) || i >= len(b.kind) {
			return false
		}
		if a.kind[i] != b.kind[i] || !bytes.Equal(a.val[i], b.val[i]) {
			return false
		}
	}
	return true
}
