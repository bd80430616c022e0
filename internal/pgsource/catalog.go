package pgsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/connector"
)

// minServerVersion is PostgreSQL 17: failover slots.
const minServerVersion = 170000

// tableInfo is one source table as the catalog describes it.
type tableInfo struct {
	spec     connector.TableSpec
	name     string // schema.name as the document wrote it
	schema   string
	relname  string
	oid      uint32
	identity byte // relreplident: d, n, f, i
	cols     []string
	oids     []uint32
	types    []string // format_type, for casts of key values
	key      []string
	partBy   []string // nil: the key
	single   bool
}

// quotedName is "schema"."name".
func (t *tableInfo) quotedName() string {
	return pgx.Identifier{t.schema, t.relname}.Sanitize()
}

// relation builds the encoder's view of the table from the catalog.
func (t *tableInfo) relation() (*relation, error) {
	return newRelation(t.oid, t.name, t.spec.Queue, t.cols, t.oids, t.key, t.partBy, t.single)
}

// checkServer refuses a PostgreSQL older than 17 or without logical WAL.
func checkServer(ctx context.Context, conn *pgx.Conn) error {
	var num int
	var wal string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('wal_level')").Scan(&num, &wal); err != nil {
		return fmt.Errorf("read the server's version and wal_level: %w", err)
	}
	if num < minServerVersion {
		return connector.Errorf("version", nil, "PostgreSQL %d.%d is too old: the source needs PostgreSQL 17 or later (failover slots); upgrade the server", num/10000, num%10000/100)
	}
	if wal != "logical" {
		return connector.Errorf("wal_level", nil, "wal_level is %q; set wal_level = logical in postgresql.conf and restart PostgreSQL", wal)
	}
	return nil
}

// loadTables reads every table of the document and checks it: it exists,
// it has a key the WAL carries, and its partitionBy names usable columns.
// Nothing is changed in PostgreSQL.
func loadTables(ctx context.Context, conn *pgx.Conn, specs []connector.TableSpec) ([]*tableInfo, error) {
	out := make([]*tableInfo, 0, len(specs))
	for i, spec := range specs {
		t, err := loadTable(ctx, conn, spec, i)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func loadTable(ctx context.Context, conn *pgx.Conn, spec connector.TableSpec, i int) (*tableInfo, error) {
	schema, rel, ok := strings.Cut(spec.Table, ".")
	if !ok {
		schema, rel = "public", spec.Table
	}
	t := &tableInfo{spec: spec, name: schema + "." + rel, schema: schema, relname: rel}
	var kind byte
	err := conn.QueryRow(ctx, `SELECT c.oid, c.relreplident::text, c.relkind::text FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, schema, rel).
		Scan(&t.oid, (*charScan)(&t.identity), (*charScan)(&kind))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, connector.Errorf("table_missing", nil, "source.tables[%d]: table %s does not exist; create it or fix the name in the document", i, t.name)
	}
	if err != nil {
		return nil, fmt.Errorf("look up table %s: %w", t.name, err)
	}
	if kind != 'r' {
		return nil, connector.Errorf("table_missing", nil, "source.tables[%d]: %s is not an ordinary table (relkind %q); name a table", i, t.name, kind)
	}
	// Columns in the order pgoutput sends them (generated columns are not
	// published).
	rows, err := conn.Query(ctx, `SELECT attname, atttypid, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum`, t.oid)
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", t.name, err)
	}
	for rows.Next() {
		var name, typ string
		var oid uint32
		if err := rows.Scan(&name, &oid, &typ); err != nil {
			rows.Close()
			return nil, err
		}
		t.cols, t.oids, t.types = append(t.cols, name), append(t.oids, oid), append(t.types, typ)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", t.name, err)
	}
	// The key: the replica identity index, else the primary key.
	cond := "i.indisprimary"
	if t.identity == 'i' {
		cond = "i.indisreplident"
	}
	rows, err = conn.Query(ctx, `SELECT a.attname FROM pg_index i
		JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1 AND `+cond+` ORDER BY k.n`, t.oid)
	if err != nil {
		return nil, fmt.Errorf("read the key of %s: %w", t.name, err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, err
		}
		t.key = append(t.key, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the key of %s: %w", t.name, err)
	}
	switch {
	case t.identity == 'n':
		return nil, connector.Errorf("replica_identity", nil, "source.tables[%d]: %s has REPLICA IDENTITY NOTHING, so the WAL carries no key; ALTER TABLE %s REPLICA IDENTITY DEFAULT (with a primary key) or USING INDEX <unique index>", i, t.name, t.quotedName())
	case len(t.key) == 0 && t.identity == 'i':
		return nil, connector.Errorf("replica_identity", nil, "source.tables[%d]: the replica identity index of %s is gone; set REPLICA IDENTITY USING INDEX <unique index> again", i, t.name)
	case len(t.key) == 0:
		return nil, connector.Errorf("replica_identity", nil, "source.tables[%d]: %s has no primary key, so the WAL carries no key for its rows; add a primary key, or ALTER TABLE %s REPLICA IDENTITY USING INDEX <unique index on NOT NULL columns>", i, t.name, t.quotedName())
	}
	if err := t.parsePartitionBy(i); err != nil {
		return nil, err
	}
	return t, nil
}

// parsePartitionBy reads "key", "single" or a list of columns: columns of
// the key, or any columns under REPLICA IDENTITY FULL (the only case where
// the WAL carries the old value of every column).
func (t *tableInfo) parsePartitionBy(i int) error {
	raw := t.spec.PartitionBy
	if len(raw) == 0 {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "key", "":
			return nil
		case "single":
			t.single = true
			return nil
		}
		return connector.Errorf("partition_by", nil, "source.tables[%d].partitionBy is %q; use \"key\", \"single\" or a list of columns", i, s)
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
		return connector.Errorf("partition_by", nil, "source.tables[%d].partitionBy must be \"key\", \"single\" or a non-empty list of column names", i)
	}
	for _, c := range list {
		if !slices.Contains(t.cols, c) {
			return connector.Errorf("partition_by", nil, "source.tables[%d].partitionBy names %q, which is not a column of %s; name columns of its key", i, c, t.name)
		}
		if t.identity != 'f' && !slices.Contains(t.key, c) {
			return connector.Errorf("partition_by", nil, "source.tables[%d].partitionBy names %q, which is not part of the key of %s (%s), so the WAL does not carry its old value; name key columns, or set REPLICA IDENTITY FULL", i, c, t.name, strings.Join(t.key, ", "))
		}
	}
	t.partBy = list
	return nil
}

// charScan scans a one-character text ("char" cast to text).
type charScan byte

func (c *charScan) Scan(src any) error {
	s, ok := src.(string)
	if !ok || len(s) != 1 {
		return fmt.Errorf("want one character, got %v", src)
	}
	*c = charScan(s[0])
	return nil
}

// relationFromStream builds the encoder's view of a table from pgoutput's
// Relation message (its columns as the WAL now carries them, so a column
// added since the start shows up as a new field) and the catalog's key and
// partition columns.
func relationFromStream(rm *pglogrepl.RelationMessage, t *tableInfo) (*relation, error) {
	names := make([]string, len(rm.Columns))
	oids := make([]uint32, len(rm.Columns))
	for i, c := range rm.Columns {
		names[i], oids[i] = c.Name, c.DataType
	}
	return newRelation(rm.RelationID, t.name, t.spec.Queue, names, oids, t.key, t.partBy, t.single)
}
