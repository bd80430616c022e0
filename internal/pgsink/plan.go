package pgsink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/connector"
)

// ident is a schema-qualified table name.
type ident struct{ schema, name string }

func parseIdent(s string) ident {
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return ident{s[:i], s[i+1:]}
	}
	return ident{"public", s}
}

func (i ident) sql() string    { return pgx.Identifier{i.schema, i.name}.Sanitize() }
func (i ident) String() string { return i.schema + "." + i.name }

// plan is what the start checks learned about the table.
type plan struct {
	// writable are the columns a message may name (generated columns
	// excluded).
	writable map[string]bool
	key      []string // upsert and cdc: the conflict columns
	meta     []metaCol
	copy     *copyPlan // nil: every row takes the populate path
	// the column sets of fastRowOp's ops, interned
	setsMu sync.Mutex
	sets   map[string]*colSet
}

type metaCol struct{ fact, column string }

// check runs the start checks of a sink against its database, creating the
// progress table when asked, and returns the plan. Every failure is a coded
// connector error whose sentence names the fix.
func (s *sink) check(ctx context.Context, conn *pgx.Conn) (*plan, error) {
	if err := s.checkProgress(ctx, conn); err != nil {
		return nil, err
	}
	var oid uint32
	err := conn.QueryRow(ctx, `SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`, s.table.schema, s.table.name).Scan(&oid)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, connector.Errorf("table_missing", nil, "table %s does not exist; the sink never creates its table: create it, or fix sink.table", s.table)
	}
	if err != nil {
		return nil, fmt.Errorf("look up table %s: %w", s.table, err)
	}
	p := &plan{writable: map[string]bool{}}
	rows, err := conn.Query(ctx, `SELECT attname, attgenerated <> '' FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", s.table, err)
	}
	generated := map[string]bool{}
	for rows.Next() {
		var name string
		var gen bool
		if err := rows.Scan(&name, &gen); err != nil {
			return nil, err
		}
		if gen {
			generated[name] = true
		} else {
			p.writable[name] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", s.table, err)
	}
	if err := s.checkPrivileges(ctx, conn, oid); err != nil {
		return nil, err
	}
	switch s.spec.Mode {
	case connector.ModeUpsert, connector.ModeCDC:
		if err := s.checkKey(ctx, conn, oid, p); err != nil {
			return nil, err
		}
	case connector.ModeSQL:
		if err := s.checkStatement(ctx, conn); err != nil {
			return nil, err
		}
	}
	facts := make([]string, 0, len(s.spec.Metadata))
	for f := range s.spec.Metadata {
		facts = append(facts, f)
	}
	sort.Strings(facts)
	for _, f := range facts {
		col := s.spec.Metadata[f]
		if !slices.Contains(connector.MetadataFacts, f) {
			return nil, connector.Errorf("metadata_column", nil, "sink.metadata.%s is not a message fact; use partition, partitionId, offset, transactionId, createdAt or payload", f)
		}
		if generated[col] {
			return nil, connector.Errorf("metadata_column", nil, "sink.metadata.%s names column %q of %s, which is generated and cannot be written; name an ordinary column", f, col, s.table)
		}
		if !p.writable[col] {
			return nil, connector.Errorf("metadata_column", nil, "sink.metadata.%s names column %q, which %s does not have; add the column or fix the document", f, col, s.table)
		}
		p.meta = append(p.meta, metaCol{fact: f, column: col})
	}
	if err := s.checkCopy(ctx, conn, oid, p); err != nil {
		return nil, err
	}
	return p, nil
}

// checkProgress creates the progress table (unless told not to) and checks
// the sink can read and write it.
func (s *sink) checkProgress(ctx context.Context, conn *pgx.Conn) error {
	if s.progress == s.table {
		return connector.Errorf("progress_table", nil, "sink.progressTable is the target table %s; name another table (the default is queen.sink_progress)", s.table)
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.progress.sql()).Scan(&exists); err != nil {
		return fmt.Errorf("look up the progress table %s: %w", s.progress, err)
	}
	if !exists && (s.spec.CreateProgressTable == nil || *s.spec.CreateProgressTable) {
		stmts := []string{
			"CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{s.progress.schema}.Sanitize(),
			`CREATE TABLE IF NOT EXISTS ` + s.progress.sql() + ` (
  sink         text        NOT NULL,
  partition_id bigint      NOT NULL,
  partition    text        NOT NULL,
  last_offset  bigint      NOT NULL,
  updated_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (sink, partition_id)
)`,
		}
		if err := createProgress(ctx, conn, stmts); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) {
				return connector.Errorf("progress_table", err, "cannot create the progress table %s (%s); grant the sink's role CREATE on the database, or create the table yourself and set createProgressTable to false", s.progress, pe.Message)
			}
			return fmt.Errorf("create the progress table %s: %w", s.progress, err)
		}
	}
	_, err := conn.Exec(ctx, `SELECT sink, partition_id, partition, last_offset, updated_at FROM `+s.progress.sql()+` LIMIT 0`)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return connector.Errorf("progress_table", err, "the progress table %s cannot be read (%s); create it with the columns sink, partition_id, partition, last_offset, updated_at, or let the sink create it", s.progress, pe.Message)
		}
		return fmt.Errorf("read the progress table %s: %w", s.progress, err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT has_table_privilege($1::regclass, 'SELECT, INSERT, UPDATE')`, s.progress.sql()).Scan(&ok); err != nil {
		return fmt.Errorf("check privileges on %s: %w", s.progress, err)
	}
	if !ok {
		return connector.Errorf("progress_table", nil, "the sink's role cannot write the progress table %s; GRANT SELECT, INSERT, UPDATE ON %s TO the role", s.progress, s.progress.sql())
	}
	return nil
}

// createProgress runs the progress table's CREATE statements under one
// session advisory lock, so that workers and nodes starting at the same
// moment create progress tables (and their schema) one after the other:
// concurrent CREATE ... IF NOT EXISTS of one object can fail in PostgreSQL
// on its catalog's unique indexes ("type ... already exists"). Each
// statement runs in a transaction of its own, begun after the lock was
// granted, so it sees what the previous holder created.
func createProgress(ctx context.Context, conn *pgx.Conn, stmts []string) error {
	const key = `hashtext('queen sink progress tables')`
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(`+key+`)`); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+key+`)`) }()
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

func (s *sink) checkPrivileges(ctx context.Context, conn *pgx.Conn, oid uint32) error {
	var need []string
	switch s.spec.Mode {
	case connector.ModeAppend:
		need = []string{"INSERT"}
	case connector.ModeUpsert:
		need = []string{"INSERT", "UPDATE"}
	case connector.ModeCDC:
		need = []string{"INSERT", "UPDATE", "DELETE"}
	default:
		return nil
	}
	var missing []string
	for _, priv := range need {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT has_table_privilege($1::oid, $2)`, oid, priv).Scan(&ok); err != nil {
			return fmt.Errorf("check privileges on %s: %w", s.table, err)
		}
		if !ok {
			missing = append(missing, priv)
		}
	}
	if len(missing) > 0 {
		return connector.Errorf("permission", nil, "the sink's role lacks %s on %s; GRANT %s ON %s TO the role",
			strings.Join(missing, ", "), s.table, strings.Join(need, ", "), s.table.sql())
	}
	return nil
}

// checkKey finds the conflict columns: sink.key, else the primary key, and
// a unique index on exactly those columns.
func (s *sink) checkKey(ctx context.Context, conn *pgx.Conn, oid uint32, p *plan) error {
	rows, err := conn.Query(ctx, `SELECT i.indisprimary,
		  (SELECT array_agg(a.attname::text ORDER BY k.ord) FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
		     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum)
		FROM pg_index i
		WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL`, oid)
	if err != nil {
		return fmt.Errorf("read the indexes of %s: %w", s.table, err)
	}
	var pk []string
	var uniques [][]string
	for rows.Next() {
		var primary bool
		var cols []string
		if err := rows.Scan(&primary, &cols); err != nil {
			return err
		}
		if primary {
			pk = cols
		}
		uniques = append(uniques, cols)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the indexes of %s: %w", s.table, err)
	}
	key := s.spec.Key
	if len(key) == 0 {
		if pk == nil {
			return connector.Errorf("no_key", nil, "table %s has no primary key, and %s mode needs a key; add a primary key, or name sink.key columns that have a unique index", s.table, s.spec.Mode)
		}
		key = pk
	}
	for _, c := range key {
		if !p.writable[c] {
			return connector.Errorf("no_key", nil, "sink.key names column %q, which %s does not have (or is generated); fix sink.key", c, s.table)
		}
	}
	want := slices.Clone(key)
	sort.Strings(want)
	for _, u := range uniques {
		u = slices.Clone(u)
		sort.Strings(u)
		if slices.Equal(u, want) {
			p.key = key
			return nil
		}
	}
	return connector.Errorf("no_key", nil, "no unique index of %s covers exactly the key columns (%s); CREATE UNIQUE INDEX ON %s (%s), or fix sink.key",
		s.table, strings.Join(key, ", "), s.table.sql(), strings.Join(key, ", "))
}

// stmtName is the sql mode's prepared statement on every connection.
const stmtName = "queen_sink_statement"

// checkStatement prepares the sql mode's statement with every parameter
// typed text, as it will run.
func (s *sink) checkStatement(ctx context.Context, conn *pgx.Conn) error {
	oids := make([]uint32, len(s.params))
	for i := range oids {
		oids[i] = 25 // text
	}
	sd, err := conn.PgConn().Prepare(ctx, stmtName, s.spec.Statement, oids)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return connector.Errorf("statement", err, "sink.statement does not prepare (%s); every parameter arrives as text, so cast it ($1::numeric) and fix the statement", pe.Message)
		}
		return fmt.Errorf("prepare the statement: %w", err)
	}
	if len(sd.ParamOIDs) != len(s.params) {
		return connector.Errorf("statement", nil, "sink.statement uses %d parameters but sink.params lists %d; make them match", len(sd.ParamOIDs), len(s.params))
	}
	return nil
}
