package pgsink

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// runs groups ops into statements: consecutive ops of one kind over the
// same columns, each key at most once (one statement cannot upsert or
// delete a row twice), truncates alone.
func runs(ops []*op) [][]*op {
	var out [][]*op
	var cur []*op
	var keys map[string]bool
	for _, o := range ops {
		if len(cur) > 0 {
			h := cur[0]
			keyed := o.kind == opUpsert || o.kind == opDelete
			if h.kind != o.kind || h.colKey != o.colKey || o.kind == opTruncate || (keyed && keys[o.key]) {
				out = append(out, cur)
				cur, keys = nil, nil
			}
		}
		if o.kind == opUpsert || o.kind == opDelete {
			if keys == nil {
				keys = map[string]bool{}
			}
			keys[o.key] = true
		}
		cur = append(cur, o)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func quoteCols(cols []string, prefix string) string {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = prefix + pgx.Identifier{c}.Sanitize()
	}
	return strings.Join(parts, ", ")
}

// statement is the SQL of a run's kind and columns, built once per worker.
func (w *worker) statement(o *op) string {
	k := fmt.Sprintf("%d\x01%s", o.kind, o.colKey)
	if q, ok := w.stmts[k]; ok {
		return q
	}
	t := w.s.table.sql()
	var q string
	switch o.kind {
	case opInsert, opUpsert:
		if len(o.cols) == 0 {
			q = "INSERT INTO " + t + " DEFAULT VALUES"
			if o.kind == opUpsert {
				q += " ON CONFLICT DO NOTHING"
			}
			break
		}
		q = "INSERT INTO " + t + " (" + quoteCols(o.cols, "") + ") SELECT " + quoteCols(o.cols, "r.") +
			" FROM jsonb_populate_recordset(NULL::" + t + ", $1::text::jsonb) AS r"
		if o.kind == opUpsert {
			var set []string
			isKey := map[string]bool{}
			for _, c := range w.plan.key {
				isKey[c] = true
			}
			for _, c := range o.cols {
				if !isKey[c] {
					id := pgx.Identifier{c}.Sanitize()
					set = append(set, id+" = EXCLUDED."+id)
				}
			}
			q += " ON CONFLICT (" + quoteCols(w.plan.key, "") + ")"
			if len(set) == 0 {
				q += " DO NOTHING"
			} else {
				q += " DO UPDATE SET " + strings.Join(set, ", ")
			}
		}
	case opDelete:
		var on []string
		for _, c := range w.plan.key {
			id := pgx.Identifier{c}.Sanitize()
			on = append(on, "x."+id+" = r."+id)
		}
		q = "DELETE FROM " + t + " AS x USING jsonb_populate_recordset(NULL::" + t + ", $1::text::jsonb) AS r WHERE " + strings.Join(on, " AND ")
	case opTruncate:
		q = "TRUNCATE " + t
	}
	w.stmts[k] = q
	return q
}

// execRun writes one run: one statement for inserts, upserts and deletes
// (the rows as one JSON array), one pipelined round trip for sql.
func (w *worker) execRun(ctx context.Context, run []*op) error {
	h := run[0]
	switch {
	case h.kind == opSQL:
		b := &pgconn.Batch{}
		for _, o := range run {
			b.ExecPrepared(stmtName, o.params, nil, nil)
		}
		res, err := w.conn.PgConn().ExecBatch(ctx, b).ReadAll()
		for _, r := range res {
			if r.Err != nil {
				return r.Err
			}
		}
		return err
	case h.kind == opTruncate:
		_, err := w.conn.Exec(ctx, w.statement(h))
		return err
	case (h.kind == opInsert || h.kind == opUpsert) && len(h.cols) == 0:
		for _, o := range run {
			if _, err := w.conn.Exec(ctx, w.statement(o)); err != nil {
				return err
			}
		}
		return nil
	}
	n := 2
	for _, o := range run {
		n += len(o.doc) + 1
	}
	var sb strings.Builder
	sb.Grow(n)
	sb.WriteByte('[')
	for i, o := range run {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.Write(o.doc)
	}
	sb.WriteByte(']')
	_, err := w.conn.Exec(ctx, w.statement(h), sb.String())
	return err
}
