package pgsource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/connector"
)

// pubTable is one table of a publication as pg_publication_tables shows it.
type pubTable struct {
	name      string
	rowFilter bool
	colList   bool
}

// readPublication returns the publication's tables, whether it publishes
// inserts, updates and deletes, and whether it exists.
func readPublication(ctx context.Context, conn *pgx.Conn, pub string) (tables []pubTable, dml, exists bool, err error) {
	var all bool
	err = conn.QueryRow(ctx, `SELECT puballtables, pubinsert AND pubupdate AND pubdelete FROM pg_publication WHERE pubname = $1`, pub).Scan(&all, &dml)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, false, nil
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("read publication %s: %w", pub, err)
	}
	// A column list shows as prattrs; pg_publication_tables lists every
	// column when there is none.
	rows, err := conn.Query(ctx, `SELECT n.nspname || '.' || c.relname, pr.prqual IS NOT NULL, pr.prattrs IS NOT NULL
		FROM pg_publication p JOIN pg_publication_rel pr ON pr.prpubid = p.oid
		JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE p.pubname = $1`, pub)
	if err != nil {
		return nil, false, true, fmt.Errorf("read the tables of publication %s: %w", pub, err)
	}
	defer rows.Close()
	for rows.Next() {
		var t pubTable
		if err := rows.Scan(&t.name, &t.rowFilter, &t.colList); err != nil {
			return nil, false, true, err
		}
		tables = append(tables, t)
	}
	if err := rows.Err(); err != nil {
		return nil, false, true, err
	}
	if all {
		// FOR ALL TABLES publishes every table whole.
		return nil, dml, true, errAllTables
	}
	return tables, dml, true, nil
}

var errAllTables = errors.New("for all tables")

// checkPublication checks a publication named by the user: it exists,
// publishes every source table whole, and publishes inserts, updates and
// deletes.
func checkPublication(ctx context.Context, conn *pgx.Conn, pub string, tables []*tableInfo) error {
	have, dml, exists, err := readPublication(ctx, conn, pub)
	if errors.Is(err, errAllTables) {
		err = nil
		have = nil
		for _, t := range tables {
			have = append(have, pubTable{name: t.name})
		}
	}
	if err != nil {
		return err
	}
	if !exists {
		return connector.Errorf("publication", nil, "publication %s does not exist and managePublication is false; have the tables' owner CREATE PUBLICATION %s FOR TABLE %s, or set managePublication to true", pub, pub, tableList(tables))
	}
	if !dml {
		return connector.Errorf("publication", nil, "publication %s does not publish inserts, updates and deletes; ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate')", pub, pub)
	}
	for _, t := range tables {
		i := slices.IndexFunc(have, func(p pubTable) bool { return p.name == t.name })
		switch {
		case i < 0:
			return connector.Errorf("publication", nil, "publication %s does not publish %s; ALTER PUBLICATION %s ADD TABLE %s, or let the source manage the publication", pub, t.name, pub, t.quotedName())
		case have[i].rowFilter:
			return connector.Errorf("publication", nil, "publication %s publishes %s with a row filter, which the snapshot would not apply; publish the whole table (ALTER PUBLICATION %s SET TABLE ... without WHERE)", pub, t.name, pub)
		case have[i].colList:
			return connector.Errorf("publication", nil, "publication %s publishes %s with a column list, which the snapshot would not apply; publish every column (ALTER PUBLICATION %s SET TABLE ... without a column list)", pub, t.name, pub)
		}
	}
	return nil
}

// managePublication creates the publication, or sets its tables to exactly
// the source's, whole.
func managePublication(ctx context.Context, conn *pgx.Conn, pub string, tables []*tableInfo) error {
	have, dml, exists, err := readPublication(ctx, conn, pub)
	ident := pgx.Identifier{pub}.Sanitize()
	list := tableList(tables)
	if errors.Is(err, errAllTables) {
		return connector.Errorf("publication", nil, "publication %s is FOR ALL TABLES, which the source cannot manage; drop it, or name another publication", pub)
	}
	if err != nil {
		return err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+ident+" FOR TABLE "+list+" WITH (publish = 'insert, update, delete, truncate')"); err != nil {
			return publicationError(pub, "create", err)
		}
		return nil
	}
	same := dml && len(have) == len(tables)
	for _, t := range tables {
		if !slices.ContainsFunc(have, func(p pubTable) bool { return p.name == t.name && !p.rowFilter && !p.colList }) {
			same = false
		}
	}
	if same {
		return nil
	}
	if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+ident+" SET TABLE "+list); err != nil {
		return publicationError(pub, "alter", err)
	}
	if !dml {
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+ident+" SET (publish = 'insert, update, delete, truncate')"); err != nil {
			return publicationError(pub, "alter", err)
		}
	}
	return nil
}

func publicationError(pub, verb string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "42809") {
		return connector.Errorf("publication", err, "the source's role cannot %s publication %s (it must own the tables); have the owner create it and set managePublication to false", verb, pub)
	}
	return fmt.Errorf("%s publication %s: %w", verb, pub, err)
}

func tableList(tables []*tableInfo) string {
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.quotedName()
	}
	return strings.Join(names, ", ")
}

// dropPublication removes a managed publication (a DELETE of the source).
func dropPublication(ctx context.Context, conn *pgx.Conn, pub string) error {
	if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pub}.Sanitize()); err != nil {
		return fmt.Errorf("drop publication %s: %w", pub, err)
	}
	return nil
}
