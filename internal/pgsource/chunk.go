package pgsource

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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

// lastKey is the printed key of the chunk's last row.
func (c *chunk) lastKey() []string {
	n := c.rows()
	if n == 0 {
		return nil
	}
	out := make([]string, len(c.rel.key))
	for i, k := range c.rel.key {
		out[i] = string(c.vals[(n-1)*c.ncol+k])
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
// in key order, in text format: the values exactly as PostgreSQL prints
// them, as the stream carries them. sizeHint is the arena size the chunk
// before needed (0: none yet).
func readChunk(ctx context.Context, conn *pgx.Conn, t *tableInfo, rel *relation, after []string, limit, sizeHint int) (*chunk, error) {
	sql := chunkQuery(t, after != nil, limit)
	params := make([][]byte, len(after))
	for i, v := range after {
		params[i] = []byte(v)
	}
	c := &chunk{table: t, rel: rel, ncol: len(t.cols), read: time.Now(),
		arena: make([]byte, 0, grown(sizeHint, 64<<10)), vals: make([][]byte, 0, min(limit*len(t.cols), 1<<17))}
	rr := conn.PgConn().ExecParams(ctx, sql, params, nil, nil, nil)
	for rr.NextRow() {
		vals := rr.Values()
		if len(vals) != c.ncol {
			rr.Close()
			return nil, fmt.Errorf("snapshot of %s: a row of %d columns, want %d", t.name, len(vals), c.ncol)
		}
		for _, v := range vals {
			if v == nil {
				c.vals = append(c.vals, nil)
				continue
			}
			c.arena = append(c.arena, v...)
			c.vals = append(c.vals, v[:len(v):len(v)]) // repointed below
		}
	}
	if _, err := rr.Close(); err != nil {
		return nil, fmt.Errorf("snapshot of %s: %w", t.name, err)
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
	return c, nil
}
