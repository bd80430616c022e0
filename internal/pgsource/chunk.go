package pgsource

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// chunk is one key-ordered read of a table: its rows' printed values,
// copied into one arena.
type chunk struct {
	table *tableInfo
	rel   *relation
	read  time.Time
	ncol  int
	// vals[r*ncol+c] is row r's column c; nil is NULL.
	vals  [][]byte
	arena []byte
}

func (c *chunk) rows() int {
	if c.ncol == 0 {
		return 0
	}
	return len(c.vals) / c.ncol
}

// row fills t with row r.
func (c *chunk) row(r int, t *tuple) {
	t.reset(c.ncol)
	for i := 0; i < c.ncol; i++ {
		v := c.vals[r*c.ncol+i]
		t.val[i] = v
		if v == nil {
			t.kind[i] = colNull
		} else {
			t.kind[i] = colText
		}
	}
}

// key is the printed key of row r (the pointer's lastKey).
func (c *chunk) key(r int) []string {
	out := make([]string, len(c.rel.key))
	for i, k := range c.rel.key {
		out[i] = string(c.vals[r*c.ncol+k])
	}
	return out
}

// chunkQuery is the SELECT of a chunk after a key (nil: from the start).
func chunkQuery(t *tableInfo, after bool, limit int) string {
	var b strings.Builder
	b.WriteString("SELECT ")
	for i, c := range t.cols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pgx.Identifier{c}.Sanitize())
	}
	b.WriteString(" FROM ")
	b.WriteString(t.quotedName())
	keys := make([]string, len(t.key))
	for i, k := range t.key {
		keys[i] = pgx.Identifier{k}.Sanitize()
	}
	if after {
		params := make([]string, len(t.key))
		for i, k := range t.key {
			params[i] = "$" + strconv.Itoa(i+1) + "::" + t.types[indexOf(t.cols, k)]
		}
		b.WriteString(" WHERE (" + strings.Join(keys, ", ") + ") > (" + strings.Join(params, ", ") + ")")
	}
	b.WriteString(" ORDER BY " + strings.Join(keys, ", "))
	b.WriteString(" LIMIT " + strconv.Itoa(limit))
	return b.String()
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// readChunk reads up to limit rows of t after key (nil: from the start),
// in key order: the values exactly as PostgreSQL prints them, as the
// stream carries them (the types chunkFormats names come in binary and
// are printed here). sizeHint is the arena size the chunk
// before needed (0: none yet). The snapshot reads its chunks in a
// pipeline with their watermarks (window.go); this is the same read on
// its own.
func readChunk(ctx context.Context, conn *pgx.Conn, t *tableInfo, rel *relation, after []string, limit, sizeHint int) (*chunk, error) {
	c := newChunk(t, rel, limit, sizeHint, nil)
	rr := conn.PgConn().ExecParams(ctx, chunkQuery(t, after != nil, limit), chunkParams(after), nil, nil, chunkFormats(t))
	if err := c.fill(rr); err != nil {
		return nil, err
	}
	return c, nil
}

// newChunk starts a chunk, in the buffers of spare (a chunk whose rows
// are pushed or dropped: nothing points into them any more) when it has
// one.
func newChunk(t *tableInfo, rel *relation, limit, sizeHint int, spare *chunk) *chunk {
	c := &chunk{table: t, rel: rel, ncol: len(t.cols), read: time.Now()}
	if spare != nil {
		c.arena, c.vals = spare.arena[:0], spare.vals[:0]
		clear(spare.vals[:cap(spare.vals)]) // no old values kept reachable
	}
	if want := grown(sizeHint, 64<<10); cap(c.arena) < want {
		c.arena = make([]byte, 0, want)
	}
	if want := min(limit*len(t.cols), 1<<17); cap(c.vals) < want {
		c.vals = make([][]byte, 0, want)
	}
	return c
}

// chunkParams are the key values a chunk's read starts after, as text.
func chunkParams(after []string) [][]byte {
	params := make([][]byte, len(after))
	for i, v := range after {
		params[i] = []byte(v)
	}
	return params
}

// fill reads the rows of rr (the chunk's query) into the chunk and closes
// it. Columns sent in binary (chunkFormats) are stored as the text their
// type's output function prints, so every value in the chunk is what the
// stream carries for it.
func (c *chunk) fill(rr *pgconn.ResultReader) error {
	t := c.table
	fields := rr.FieldDescriptions()
	if len(fields) != c.ncol {
		// A failed query describes no columns: its error says more.
		if _, err := rr.Close(); err != nil {
			return fmt.Errorf("snapshot of %s: %w", t.name, err)
		}
		return fmt.Errorf("snapshot of %s: a result of %d columns, want %d", t.name, len(fields), c.ncol)
	}
	var printer binaryPrinter
	// binOID[i] is the type of column i when it came in binary, else 0.
	binOID := make([]uint32, c.ncol)
	for i, f := range fields {
		if f.Format == 1 {
			binOID[i] = f.DataTypeOID
		}
	}
	for rr.NextRow() {
		vals := rr.Values()
		if len(vals) != c.ncol {
			rr.Close()
			return fmt.Errorf("snapshot of %s: a row of %d columns, want %d", t.name, len(vals), c.ncol)
		}
		for i, v := range vals {
			if v == nil {
				c.vals = append(c.vals, nil)
				continue
			}
			start := len(c.arena)
			if oid := binOID[i]; oid != 0 {
				var err error
				if c.arena, err = printer.appendText(c.arena, oid, v); err != nil {
					rr.Close()
					return fmt.Errorf("snapshot of %s: column %s: %w", t.name, t.cols[i], err)
				}
			} else {
				c.arena = append(c.arena, v...)
			}
			// Only the length counts here: repointed below.
			c.vals = append(c.vals, c.arena[start:len(c.arena):len(c.arena)])
		}
	}
	if _, err := rr.Close(); err != nil {
		return fmt.Errorf("snapshot of %s: %w", t.name, err)
	}
	// The arena may have moved while it grew: point every value into
	// its final backing array.
	off := 0
	for i, v := range c.vals {
		if v == nil {
			continue
		}
		n := len(v)
		c.vals[i] = c.arena[off : off+n : off+n]
		off += n
	}
	return nil
}
