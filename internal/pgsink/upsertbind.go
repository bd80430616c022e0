package pgsink

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// An upsert run's arrays go as parameters of the extended protocol:
// PostgreSQL reads them as they arrive, where a statement with the arrays
// as literals in a simple query is lexed and parsed first (about a fifth of the statement's
// cost for the benchmark's rows, docs/benchmarks.md, "Session 13"). The
// INSERT is prepared once per connection and column set, so it is not
// planned again either. A batch whose runs all bind is sent as the
// statements of one pipeline up to its Sync (the advance, the runs, the
// barrier row), one implicit transaction as the simple query was: the
// first error skips the rest, and the Sync rolls the transaction back.

// maxUpsertStmts bounds the upsert statements prepared on a connection;
// runs over further column sets are parsed each time.
const maxUpsertStmts = 32

// upsertStmts is what a worker's connection has prepared for upserts.
type upsertStmts struct {
	pc    *pgconn.PgConn
	names map[string]string // by column set (op.colKey)
}

// extStmt is one statement of an extended-protocol step: a prepared one by
// name, or its text, parsed unnamed.
type extStmt struct {
	name, sql string
	params    [][]byte
	formats   []int16 // the params' formats, nil for all text
	colKey    string  // an upsert's column set, to prepare it by
}

// upsertStmt is the run's statement: its prepared name on this
// connection, or (name "") its text. With ctx it prepares it when it is
// not yet, which needs the connection idle.
func (w *worker) upsertStmt(ctx context.Context, h *op) (name, sql string) {
	k := "u\x01" + h.colKey
	sql, ok := w.stmts[k]
	if !ok {
		sql = w.unnestParamSQL(h)
		w.stmts[k] = sql
	}
	if name = w.preparedUpsert(ctx, h.colKey, sql); name != "" {
		return name, ""
	}
	return "", sql
}

// preparedUpsert is the name of the upsert statement sql of a column set
// on this connection, "" when it is not prepared; with ctx it prepares it
// first, when the connection is idle.
func (w *worker) preparedUpsert(ctx context.Context, colKey, sql string) string {
	pc := w.conn.PgConn()
	if w.ups.pc != pc {
		w.ups.pc, w.ups.names = pc, map[string]string{}
	}
	if name, ok := w.ups.names[colKey]; ok {
		return name
	}
	if ctx == nil || len(w.flights) > 0 || len(w.ups.names) >= maxUpsertStmts {
		return ""
	}
	name := "queen_sink_upsert_" + strconv.Itoa(len(w.ups.names))
	if _, err := pc.Prepare(ctx, name, sql, nil); err != nil {
		// The unnamed statement meets the same error, where the batch's
		// error handling sees it.
		return ""
	}
	w.ups.names[colKey] = name
	return name
}

// queueUnnest adds an upsert run whose rows all take COPY to a pipelined
// batch.
func (w *worker) queueUnnest(ctx context.Context, b *pgconn.Batch, run []*op) {
	name, sql := w.upsertStmt(ctx, run[0])
	params, formats := w.unnestParams(run)
	if name != "" {
		b.ExecPrepared(name, params, formats, nil)
		return
	}
	b.ExecParams(sql, params, nil, formats, nil)
}

// boundLead is the step of a one-round-trip upsert batch (leadStep) as
// extended-protocol statements: the advance, each run, the barrier row
// when the batch closes its group; nil when the batch's upserts do not
// take unnest.
func (w *worker) boundLead(rs [][]*op, parts []*partWork, applied func(p *partWork, i int) bool) *copyStep {
	if !w.unnesting() {
		return nil
	}
	for _, run := range rs {
		if run[0].copy == nil {
			return nil
		}
	}
	st := w.newCopyStep()
	pids, known, next := advanceArgs(parts, applied)
	name := []byte(w.s.name)
	st.ext = append(st.ext, extStmt{name: stmtAdvance, params: [][]byte{name, pids, known, next}})
	for _, run := range rs {
		stmt, sql := w.upsertStmt(nil, run[0])
		params, formats := w.unnestParams(run)
		st.ext = append(st.ext, extStmt{name: stmt, sql: sql, params: params, formats: formats, colKey: run[0].colKey})
	}
	if w.closing {
		st.ext = append(st.ext, extStmt{name: stmtBarrier, params: [][]byte{name, barrierRow(parts[0].pid, parts[0].name), []byte(w.durableCommit)}})
	}
	return st
}

// appendStep frames a step's statements into b, to be written without
// reading: its simple query, or its extended-protocol statements and their
// Sync.
func appendStep(b []byte, st *copyStep) ([]byte, error) {
	if st.ext == nil {
		sql := st.sql.String()
		b = appendMsgHead(b, 'Q', len(sql)+1)
		return append(append(b, sql...), 0), nil
	}
	var err error
	for _, e := range st.ext {
		if e.name == "" {
			if b, err = (&pgproto3.Parse{Query: e.sql}).Encode(b); err != nil {
				return b, fmt.Errorf("frame the upsert statement: %w", err)
			}
		}
		if b, err = (&pgproto3.Bind{PreparedStatement: e.name, ParameterFormatCodes: e.formats, Parameters: e.params}).Encode(b); err != nil {
			return b, fmt.Errorf("frame the upsert's parameters: %w", err)
		}
		if b, err = (&pgproto3.Execute{}).Encode(b); err != nil {
			return b, fmt.Errorf("frame the upsert's execute: %w", err)
		}
	}
	return (&pgproto3.Sync{}).Encode(b)
}

// runExt runs a step of extended-protocol statements on the idle
// connection, preparing the upserts not prepared yet.
func (w *worker) runExt(ctx context.Context, st *copyStep) error {
	b := &pgconn.Batch{}
	for _, e := range st.ext {
		if e.name == "" && e.colKey != "" {
			e.name = w.preparedUpsert(ctx, e.colKey, e.sql)
		}
		if e.name != "" {
			b.ExecPrepared(e.name, e.params, e.formats, nil)
		} else {
			b.ExecParams(e.sql, e.params, nil, e.formats, nil)
		}
	}
	return execBatch(ctx, w.conn.PgConn(), b)
}

// unnestType says whether a column of type elem (copyPlan.elems) can be
// upserted from an array (unnest.go): not an interval with fields, whose
// input reads a value differently with its typmod than without it.
func unnestType(elem string) bool {
	return !strings.HasPrefix(elem, "interval ")
}
