package pgsink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// The COPY path: in append and upsert mode a run of rows whose every
// column the package can express as COPY text is written with COPY FROM
// STDIN instead of through jsonb_populate_recordset: an append batch of
// one run straight into the table; otherwise every run into a temporary
// staging table, then one INSERT (... ON CONFLICT) per run from it. The
// rows are the same; which columns can take it is decided once, at start,
// from the table's definition.

// stageTable is the per-connection staging table of the COPY path, and
// stageSeq its column that keeps the batch's order.
const (
	stageTable = "queen_sink_stage"
	stageSeq   = "queen_stage_seq"
)

// The type oids of text, json and jsonb.
const (
	textOID  = 25
	jsonOID  = 114
	jsonbOID = 3802
)

// copyPlan is what the start checks learned for the COPY path.
type copyPlan struct {
	conv  map[string]conv   // the columns COPY can write, and how
	types map[string]string // their types as format_type prints them (the staging table's)
	// the element types of their array literals in an upsert (unnest.go):
	// the column's type, but without the length of a character or bit
	// type, which an explicit cast would cut to size where an INSERT
	// refuses what is not trailing spaces
	elems map[string]string
	// upserts are written from array literals of the columns' own types
	// (unnest.go) instead of through the staging table
	unnest bool
	// the columns whose own type is text (not a domain over it): their
	// upsert arrays go in binary format (unnest.go)
	binText map[string]bool
	// each column's binary COPY form, by its base type (copybinary.go),
	// and the same for a column that is not a domain and not text, whose
	// upsert array can be bound in binary (unnest.go)
	bin, binArray map[string]binKind
}

// checkCopy decides which columns of the table the COPY path writes. It
// leaves p.copy nil (everything takes the populate path) where COPY would
// not do what the INSERT does: rules (COPY ignores them), row-level
// security (COPY refuses it), a server encoding other than UTF8.
func (s *sink) checkCopy(ctx context.Context, conn *pgx.Conn, oid uint32, p *plan) error {
	if s.spec.Mode != connector.ModeAppend && s.spec.Mode != connector.ModeUpsert {
		return nil
	}
	var rules, rls bool
	var enc string
	if err := conn.QueryRow(ctx, `SELECT c.relhasrules, c.relrowsecurity, current_setting('server_encoding')
		FROM pg_class c WHERE c.oid = $1`, oid).Scan(&rules, &rls, &enc); err != nil {
		return fmt.Errorf("read the definition of %s: %w", s.table, err)
	}
	if rules || rls || enc != "UTF8" {
		s.log.Info("sink writes through jsonb_populate_recordset only", "table", s.table.String(), "rules", rules, "row_security", rls, "server_encoding", enc)
		return nil
	}
	// Each column's type, resolved through domains to its base: arrays and
	// composites are filled element by element or field by field by
	// populate, so they stay there; GENERATED ALWAYS identity columns too,
	// since COPY writes them where INSERT refuses.
	rows, err := conn.Query(ctx, `WITH RECURSIVE cols AS (
		  SELECT a.attname::text AS name, a.attidentity = 'a' AS always, format_type(a.atttypid, a.atttypmod) AS typ,
		         CASE a.atttypid WHEN 'bpchar'::regtype THEN 'bpchar' WHEN 'varchar'::regtype THEN 'varchar'
		           WHEN 'bit'::regtype THEN '"bit"' WHEN 'varbit'::regtype THEN 'varbit'
		           ELSE format_type(a.atttypid, a.atttypmod) END AS elem,
		         a.atttypid AS base, a.atttypid AS own, 0 AS depth
		  FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
		  UNION ALL
		  SELECT c.name, c.always, c.typ, c.elem, t.typbasetype, c.own, c.depth + 1
		  FROM cols c JOIN pg_type t ON t.oid = c.base WHERE t.typtype = 'd' AND c.depth < 32)
		SELECT c.name, c.always, c.typ, c.elem, c.base, c.own, t.typtype::text, t.typsubscript::regproc::text = 'array_subscript_handler',
		       o.typarray <> 0 AND o.typdelim = ','
		FROM cols c JOIN pg_type t ON t.oid = c.base JOIN pg_type o ON o.oid = c.own WHERE t.typtype <> 'd'`, oid)
	if err != nil {
		return fmt.Errorf("read the column types of %s: %w", s.table, err)
	}
	cp := &copyPlan{conv: map[string]conv{}, types: map[string]string{}, elems: map[string]string{}, binText: map[string]bool{}, bin: map[string]binKind{}, binArray: map[string]binKind{}, unnest: s.spec.Mode == connector.ModeUpsert}
	for rows.Next() {
		var name, typ, elem, typtype string
		var base, own uint32
		var always, array, arrayOf bool
		if err := rows.Scan(&name, &always, &typ, &elem, &base, &own, &typtype, &array, &arrayOf); err != nil {
			return fmt.Errorf("read the column types of %s: %w", s.table, err)
		}
		if always || array || !strings.Contains("berm", typtype) {
			continue
		}
		c := convText
		switch base {
		case jsonOID:
			c = convJSON
		case jsonbOID:
			c = convJSONB
		}
		cp.conv[name], cp.types[name], cp.elems[name] = c, typ, elem
		cp.binText[name] = own == textOID && elem == "text"
		cp.bin[name] = binKindOf(base)
		if k := binKindOf(own); own == base && k != binText {
			cp.binArray[name] = k
		}
		cp.unnest = cp.unnest && arrayOf && unnestType(elem)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the column types of %s: %w", s.table, err)
	}
	if p.writable[stageSeq] {
		return nil // the staging table's own column; populate it is
	}
	if s.spec.Mode == connector.ModeUpsert {
		for _, k := range p.key {
			if cp.conv[k] == 0 {
				return nil
			}
		}
	}
	if len(cp.conv) > 0 {
		p.copy = cp
	}
	if cp.unnest && len(cp.conv) > 0 {
		// Every type's array as the statements will spell it.
		var casts []string
		for _, typ := range cp.elems {
			casts = append(casts, "NULL::"+typ+"[]")
		}
		sort.Strings(casts)
		if err := conn.PgConn().Exec(ctx, "SELECT "+strings.Join(casts, ", ")).Close(); err != nil {
			s.log.Info("sink upserts through its staging table: a column's type has no array type it can name", "table", s.table.String(), "err", err)
			cp.unnest = false
		}
	}
	return nil
}

// copyRow is the COPY line (without its newline) of a row op over cols,
// or nil when a value needs the populate path. obj holds the message's
// top-level values, meta the metadata columns' JSON values (they win).
func copyRow(cp *copyPlan, cols []string, obj map[string]json.RawMessage, meta map[string][]byte, scratch *[]byte) []byte {
	n := 0
	for _, c := range cols {
		n += len(obj[c]) + len(meta[c]) + 1
	}
	row := make([]byte, 0, n+8)
	for i, c := range cols {
		cv := cp.conv[c]
		if cv == 0 {
			return nil
		}
		v, ok := meta[c]
		if !ok {
			v = obj[c]
		}
		if i > 0 {
			row = append(row, '\t')
		}
		if row, ok = appendField(row, cv, v, scratch); !ok {
			return nil
		}
	}
	return row
}

// metaJSON is each metadata column's value as JSON, as withMeta writes it
// into the populate path's document.
func (s *sink) metaJSON(p *plan, m *broker.Delivery, raw []byte) map[string][]byte {
	out := make(map[string][]byte, len(p.meta))
	for _, mc := range p.meta {
		var v []byte
		switch mc.fact {
		case "partition":
			v, _ = json.Marshal(m.Partition)
		case "partitionId":
			v = strconv.AppendUint(nil, m.PartitionID, 10)
		case "offset":
			v = strconv.AppendUint(nil, m.Offset, 10)
		case "transactionId":
			v, _ = json.Marshal(m.TxID)
		case "createdAt":
			v = append(append(append(v, '"'), time.UnixMicro(m.CreatedAt).UTC().Format(timeLayout)...), '"')
		case "payload":
			v = bytes.TrimSpace(raw)
		}
		out[mc.column] = v
	}
	return out
}

// ensureStage creates the connection's staging table for the COPY path,
// once per connection: temporary, emptied at every commit.
func (w *worker) ensureStage(ctx context.Context) error {
	pc := w.conn.PgConn()
	if w.staged == pc {
		return nil
	}
	cols := make([]string, 0, len(w.plan.copy.types))
	for c := range w.plan.copy.types {
		cols = append(cols, c)
	}
	sort.Strings(cols)
	defs := []string{pgx.Identifier{stageSeq}.Sanitize() + " int"}
	for _, c := range cols {
		defs = append(defs, pgx.Identifier{c}.Sanitize()+" "+w.plan.copy.types[c])
	}
	q := "DROP TABLE IF EXISTS pg_temp." + stageTable + "; CREATE TEMPORARY TABLE " + stageTable +
		" (" + strings.Join(defs, ", ") + ") ON COMMIT DELETE ROWS"
	if err := pc.Exec(ctx, q).Close(); err != nil {
		return fmt.Errorf("create the staging table: %w", err)
	}
	w.staged = pc
	return nil
}

// copyStep is one COPY FROM STDIN of the fast path and the statements
// sent after it in the same simple query.
type copyStep struct {
	sql  strings.Builder
	data []byte
	ext  []extStmt // instead of sql: extended-protocol statements (upsertbind.go)
	// data is the batch's own lines (contiguousLines), not the worker's
	// buffer: it is not kept as the next step's buffer, since a batch
	// done again writes its lines again
	borrowed bool
}

// appendCopyRun makes the step a COPY of one run into the table (append).
// A run whose lines lie one after the other in the batch's arena, as
// decode leaves an append batch's, is sent from there without a copy.
func (w *worker) appendCopyRun(st *copyStep, run []*op) {
	start := len(st.data)
	if kinds := w.binaryKinds(run[0]); kinds != nil && start == 0 {
		size := 0
		for _, o := range run {
			size += len(o.copy) + 1
		}
		if data, ok := appendBinaryRun(st.data, kinds, run); ok {
			st.data = data
			w.s.binarySent.Add(int64(len(run)))
			st.sql.WriteString("COPY " + w.s.table.sql() + " (" + quoteCols(run[0].cols, "") + ") FROM STDIN (FORMAT binary)" + rowByRow(len(run), size))
			return
		}
		st.data = st.data[:0]
	}
	if lines, ok := contiguousLines(run); ok && start == 0 {
		st.data, st.borrowed = lines, true
	} else {
		for _, o := range run {
			st.data = append(st.data, o.copy...)
			st.data = append(st.data, '\n')
		}
	}
	st.sql.WriteString("COPY " + w.s.table.sql() + " (" + quoteCols(run[0].cols, "") + ") FROM STDIN" + rowByRow(len(run), len(st.data)-start))
}

// contiguousLines is the COPY data of a run whose lines lie one after the
// other in one buffer, each followed by its newline (fastRowOp leaves
// them so in a batch's arena), or false. The data's capacity ends with
// it: an append to it copies.
func contiguousLines(run []*op) ([]byte, bool) {
	if len(run) == 0 {
		return nil, false
	}
	first := run[0].copy
	whole := first[:cap(first)]
	off := 0
	for _, o := range run {
		n := len(o.copy)
		if n == 0 || off+n >= len(whole) || &whole[off] != &o.copy[0] || whole[off+n] != '\n' {
			return nil, false
		}
		off += n + 1
	}
	return whole[:off:off], true
}

// PostgreSQL's COPY FROM buffers up to this many rows, or this many bytes
// of their lines, before it writes them as one multi-insert
// (copyfrom.c, MAX_BUFFERED_TUPLES and MAX_BUFFERED_BYTES).
const (
	pgCopyBufferedRows  = 1000
	pgCopyBufferedBytes = 65535
)

// copyMultiInsert is for benchmarks: every COPY uses PostgreSQL's
// multi-insert, as before rowByRow.
var copyMultiInsert bool

// rowByRow is the WHERE clause that makes a COPY of rows lines of size
// bytes insert its rows one at a time, "" where PostgreSQL's multi-insert
// costs less. A multi-insert COPY creates a tuple slot per row it
// buffers, and each slot's reference to the table's tuple descriptor is
// remembered in the statement's resource owner, whose hash table puts
// equal entries in one run: each reference added or removed steps over
// the ones before it, so a COPY pays for its slots squared, more than its
// rows' own insert for a batch of short rows. A volatile WHERE clause
// (always true) makes COPY insert row by row with one slot, a little
// dearer per row than a multi-insert without that cost: cheaper unless
// the rows are many more than the slots (docs/design/connectors.md, "The
// sink's COPY").
func rowByRow(rows, size int) string {
	if copyMultiInsert || rows == 0 {
		return ""
	}
	slots := min(rows, pgCopyBufferedRows, pgCopyBufferedBytes/max(size/rows, 1)+1)
	if rows > slots+slots*slots/128 {
		return ""
	}
	return " WHERE pg_catalog.random() >= 0"
}

// stageRuns writes every COPY run of a batch into one COPY of the staging
// table, each row with its place in the batch, and returns each run's
// INSERT (... ON CONFLICT for upserts) from it, by the run's index.
func (w *worker) stageRuns(st *copyStep, runs [][]*op) map[int]string {
	var union []string
	for _, run := range runs {
		if run[0].copy != nil {
			for _, c := range run[0].cols {
				if !slices.Contains(union, c) {
					union = append(union, c)
				}
			}
		}
	}
	sort.Strings(union)
	inserts := map[int]string{}
	seq, start := 0, len(st.data)
	for ri, run := range runs {
		if run[0].copy == nil {
			continue
		}
		first := seq
		for _, o := range run {
			st.data = strconv.AppendInt(st.data, int64(seq), 10)
			seq++
			fields := o.copy
			k := 0
			for _, c := range union {
				st.data = append(st.data, '\t')
				if k < len(o.cols) && o.cols[k] == c {
					end := bytes.IndexByte(fields, '\t')
					if end < 0 {
						end = len(fields)
					}
					st.data = append(st.data, fields[:end]...)
					fields = fields[min(end+1, len(fields)):]
					k++
				} else {
					st.data = append(st.data, '\\', 'N')
				}
			}
			st.data = append(st.data, '\n')
		}
		h := run[0]
		q := "INSERT INTO " + w.s.table.sql() + " (" + quoteCols(h.cols, "") + ") SELECT " + quoteCols(h.cols, "") +
			" FROM pg_temp." + stageTable + " WHERE " + pgx.Identifier{stageSeq}.Sanitize() + " BETWEEN " +
			strconv.Itoa(first) + " AND " + strconv.Itoa(seq-1) + " ORDER BY " + pgx.Identifier{stageSeq}.Sanitize()
		if h.kind == opUpsert {
			q += w.onConflict(h)
		}
		inserts[ri] = q
	}
	st.sql.WriteString("COPY pg_temp." + stageTable + " (" + pgx.Identifier{stageSeq}.Sanitize() + ", " + quoteCols(union, "") + ") FROM STDIN" + rowByRow(seq, len(st.data)-start))
	return inserts
}

// quoteLiteral is s as an SQL string literal, whatever
// standard_conforming_strings says.
func quoteLiteral(s string) string {
	return "E'" + literalEscaper.Replace(s) + "'"
}

var literalEscaper = strings.NewReplacer(`\`, `\\`, `'`, `''`)

// moveSQL is queueMove's statement for the simple query that carries a
// COPY (it takes no parameters); "" when no offset moves.
func (w *worker) moveSQL(parts []*partWork, applied func(p *partWork, i int) bool) string {
	moves := moveJSON(parts, applied)
	if moves == nil {
		return ""
	}
	return "EXECUTE " + stmtMove + "(" + quoteLiteral(w.s.name) + ", '" + string(moves) + "')"
}

func (w *worker) newCopyStep() *copyStep {
	return &copyStep{data: w.copyBuf[:0]}
}

// runCopy sends the step's simple query and streams its rows.
func (w *worker) runCopy(ctx context.Context, st *copyStep) error {
	rd := w.copyRd
	if rd == nil {
		rd = new(bytes.Reader)
		w.copyRd = rd
	}
	rd.Reset(st.data)
	_, err := w.conn.PgConn().CopyFrom(ctx, rd, st.sql.String())
	if err != nil {
		// When the connection breaks, pgconn's CopyFrom can return while
		// its goroutine that reads rd still runs: neither the reader nor
		// the data is used again (TestCopyReaderNotReusedAfterFailure).
		w.copyRd = nil
		if !st.borrowed {
			w.copyBuf = nil
		}
		return err
	}
	rd.Reset(nil)
	if !st.borrowed {
		w.copyBuf = st.data[:0]
	}
	return nil
}

// runStep runs a step: its simple query alone when it has no COPY data.
func (w *worker) runStep(ctx context.Context, st *copyStep) error {
	if st.ext != nil {
		return w.runExt(ctx, st)
	}
	if len(st.data) == 0 {
		_, err := w.conn.PgConn().Exec(ctx, st.sql.String()).ReadAll()
		return err
	}
	return w.runCopy(ctx, st)
}

// prepareCopy makes sure the worker's connection has its staging table.
// A role that may not create temporary tables makes this worker write
// upserts through populate instead, and appends of several runs with one
// COPY each.
func (w *worker) prepareCopy(ctx context.Context, items []*item) error {
	if w.plan.copy == nil {
		return nil
	}
	if !w.noStage {
		err := w.ensureStage(ctx)
		var pe *pgconn.PgError
		switch {
		case errors.As(err, &pe) && strings.HasPrefix(pe.Code, "42"):
			w.noStage = true
			w.s.log.Warn("sink cannot create its temporary staging table, so it writes more slowly (upserts through jsonb_populate_recordset); GRANT TEMPORARY ON DATABASE to the sink's role", "err", err)
		case err != nil:
			return err
		}
	}
	if w.noStage && w.s.spec.Mode == connector.ModeUpsert {
		for _, it := range items {
			for j := range it.ops {
				it.ops[j].copy = nil
			}
		}
	}
	return nil
}
