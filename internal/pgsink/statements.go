package pgsink

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// runs groups ops into statements: consecutive ops of one kind over the
// same columns and write path (COPY or populate), each key at most once
// (one statement cannot upsert or delete a row twice), truncates alone.
func runs(ops []*op) [][]*op {
	var out [][]*op
	start := 0 // a run is a piece of ops: ops[start:i]
	var keys map[string]bool
	for i, o := range ops {
		if i > start {
			h := ops[start]
			keyed := o.kind == opUpsert || o.kind == opDelete
			if h.kind != o.kind || h.colKey != o.colKey || o.kind == opTruncate || (keyed && keys[o.key]) || (h.copy == nil) != (o.copy == nil) {
				out = append(out, ops[start:i:i])
				start, keys = i, nil
			}
		}
		if o.kind == opUpsert || o.kind == opDelete {
			if keys == nil {
				keys = make(map[string]bool, len(ops)-i) // most batches are one run
			}
			keys[o.key] = true
		}
	}
	if start < len(ops) {
		out = append(out, ops[start:len(ops):len(ops)])
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
			q += w.onConflict(o)
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

// onConflict is an upsert's ON CONFLICT clause: the columns o names,
// other than the key, take the new values.
func (w *worker) onConflict(o *op) string {
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
	q := " ON CONFLICT (" + quoteCols(w.plan.key, "") + ")"
	if len(set) == 0 {
		return q + " DO NOTHING"
	}
	return q + " DO UPDATE SET " + strings.Join(set, ", ")
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

// textOIDs types every parameter text; the statements cast them.
var textOIDs = [][]uint32{nil, {25}, {25, 25}}

// docArray is the run's rows as one JSON array.
func docArray(run []*op) []byte {
	n := 2
	for _, o := range run {
		n += len(o.doc) + 1
	}
	buf := make([]byte, 0, n)
	buf = append(buf, '[')
	for i, o := range run {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, o.doc...)
	}
	return append(buf, ']')
}

// queueRun adds a run's statements to a pipelined batch.
func (w *worker) queueRun(b *pgconn.Batch, run []*op) {
	h := run[0]
	switch {
	case h.kind == opSQL:
		for _, o := range run {
			b.ExecPrepared(stmtName, o.params, nil, nil)
		}
	case h.kind == opTruncate:
		b.ExecParams(w.statement(h), nil, nil, nil, nil)
	case (h.kind == opInsert || h.kind == opUpsert) && len(h.cols) == 0:
		for _, o := range run {
			b.ExecParams(w.statement(o), nil, nil, nil, nil)
		}
	default:
		b.ExecParams(w.statement(h), [][]byte{docArray(run)}, textOIDs[1], nil, nil)
	}
}

// queueLock adds the statements that make sure the batch's partitions have
// progress rows, then lock them in partition order (so workers never
// deadlock on them) and read their offsets.
func (w *worker) queueLock(b *pgconn.Batch, parts []*partWork) {
	rows := make([]byte, 0, 32*len(parts))
	ids := make([]byte, 0, 12*len(parts))
	rows = append(rows, '[')
	ids = append(ids, '{')
	for i, p := range parts {
		if i > 0 {
			rows = append(rows, ',')
			ids = append(ids, ',')
		}
		name, _ := json.Marshal(p.name)
		rows = append(rows, '[')
		rows = strconv.AppendUint(rows, p.pid, 10)
		rows = append(rows, ',')
		rows = append(rows, name...)
		rows = append(rows, ']')
		ids = strconv.AppendUint(ids, p.pid, 10)
	}
	rows = append(rows, ']')
	ids = append(ids, '}')
	sink := []byte(w.s.name)
	b.ExecPrepared(stmtLockInsert, [][]byte{sink, rows}, nil, nil)
	b.ExecPrepared(stmtLockSelect, [][]byte{sink, ids}, nil, nil)
}

// The fast path's progress statements, prepared once per connection.
const (
	stmtLockInsert = "queen_sink_lock_insert"
	stmtLockSelect = "queen_sink_lock_select"
	stmtMove       = "queen_sink_move"
	stmtBarrier    = "queen_sink_barrier"
)

// progressStatements are the fast path's progress statements, by name.
func progressStatements(pt string) map[string]string {
	return map[string]string{
		stmtLockInsert: `INSERT INTO ` + pt + ` (sink, partition_id, partition, last_offset)
		SELECT $1, (e->>0)::bigint, e->>1, -1 FROM jsonb_array_elements($2::text::jsonb) AS e ORDER BY 2
		ON CONFLICT (sink, partition_id) DO NOTHING`,
		stmtLockSelect: `SELECT partition_id, last_offset FROM ` + pt + `
		WHERE sink = $1 AND partition_id = ANY($2::text::bigint[]) ORDER BY partition_id FOR UPDATE`,
		stmtMove: `UPDATE ` + pt + ` AS x SET last_offset = (e->>1)::bigint, updated_at = now()
		FROM jsonb_array_elements($2::text::jsonb) AS e WHERE x.sink = $1 AND x.partition_id = (e->>0)::bigint`,
		// what makes a commit a durability barrier: synchronous_commit
		// for this transaction as $3 says (the connection's own value,
		// on where that is off), and a write, the row as it is (or as a
		// missing row reads, -1)
		stmtBarrier: `INSERT INTO ` + pt + ` AS x (sink, partition_id, partition, last_offset)
		SELECT $1, ($2::text::jsonb->>0)::bigint, $2::text::jsonb->>1, -1
		FROM (SELECT set_config('synchronous_commit', $3::text, true)) AS sc(v) WHERE sc.v IS NOT NULL
		ON CONFLICT (sink, partition_id) DO UPDATE SET last_offset = x.last_offset`,
		stmtAdvance: advanceSQL(pt),
	}
}

// prepareProgress prepares the progress statements on the worker's
// connection, once per connection, and sets the connection to commit
// without a flush: every batch's transaction commits so, and a barrier
// sets the connection's own value (on, where that is off) for its own.
func (w *worker) prepareProgress(ctx context.Context) error {
	pc := w.conn.PgConn()
	if w.prepared == pc {
		return nil
	}
	for name, q := range progressStatements(w.s.progress.sql()) {
		if _, err := pc.Prepare(ctx, name, q, textOIDs[2]); err != nil {
			return fmt.Errorf("prepare the progress statements: %w", err)
		}
	}
	var sc string
	if err := w.conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
		return fmt.Errorf("read synchronous_commit: %w", err)
	}
	if sc == "off" && w.s.syncOffLogged.CompareAndSwap(false, true) {
		w.s.log.Info("synchronous_commit is off for the sink's role or server; the commits that make the sink's batches durable turn it on for themselves, so a batch is acked only once it is on disk")
	}
	w.durableCommit = sc
	if sc == "off" {
		w.durableCommit = "on"
	}
	if !syncEach {
		if err := pc.Exec(ctx, asyncCommit).Close(); err != nil {
			return fmt.Errorf("set synchronous_commit: %w", err)
		}
	}
	w.nameLit = quoteLiteral(w.s.name)
	w.prepared = pc
	return nil
}

// readLast reads the locked offsets into the partitions.
func readLast(r *pgconn.Result, parts []*partWork) error {
	last := make(map[uint64]int64, len(r.Rows))
	for _, row := range r.Rows {
		if len(row) != 2 {
			return fmt.Errorf("progress row with %d columns", len(row))
		}
		pid, err := strconv.ParseUint(string(row[0]), 10, 64)
		if err != nil {
			return fmt.Errorf("progress row partition_id %q: %w", row[0], err)
		}
		off, err := strconv.ParseInt(string(row[1]), 10, 64)
		if err != nil {
			return fmt.Errorf("progress row last_offset %q: %w", row[1], err)
		}
		last[pid] = off
	}
	for _, p := range parts {
		off, ok := last[p.pid]
		if !ok {
			return fmt.Errorf("progress row of partition %d vanished", p.pid)
		}
		p.last = off
	}
	return nil
}

// queueMove adds the update of each partition's offset to the highest one
// resolved: every message up to it applied (now or before).
func (w *worker) queueMove(b *pgconn.Batch, parts []*partWork, applied func(p *partWork, i int) bool) {
	moves := moveJSON(parts, applied)
	if moves == nil {
		return
	}
	b.ExecPrepared(stmtMove, [][]byte{[]byte(w.s.name), moves}, nil, nil)
}

// moveJSON is the [[partition id, offset], ...] of the partitions whose
// offset moves, nil for none.
func moveJSON(parts []*partWork, applied func(p *partWork, i int) bool) []byte {
	moves := []byte{'['}
	n := 0
	for _, p := range parts {
		if t := top(p, applied); t > p.last {
			if n > 0 {
				moves = append(moves, ',')
			}
			n++
			moves = append(moves, '[')
			moves = strconv.AppendUint(moves, p.pid, 10)
			moves = append(moves, ',')
			moves = strconv.AppendInt(moves, t, 10)
			moves = append(moves, ']')
		}
	}
	if n == 0 {
		return nil
	}
	return append(moves, ']')
}
