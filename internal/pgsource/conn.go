package pgsource

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/connector"
)

// sessionSettings make PostgreSQL print every value the same way on the
// replication connection (pgoutput's text output) and on the query
// connection (the snapshot), whatever the server's defaults are.
const sessionSettings = `SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET IntervalStyle = 'postgres'; ` +
	`SET bytea_output = 'hex'; SET extra_float_digits = 1`

// dialQuery opens the query connection (checks, snapshot, heartbeats).
func dialQuery(ctx context.Context, env connector.Env) (*pgx.Conn, error) {
	conn, err := connector.Connect(ctx, env)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, sessionSettings); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("set the session's output formats: %w", err)
	}
	return conn, nil
}

// dialReplication opens a replication connection (replication=database).
func dialReplication(ctx context.Context, env connector.Env) (*pgconn.PgConn, error) {
	conn, err := connector.ConnectReplication(ctx, env)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, sessionSettings).ReadAll(); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("set the replication session's output formats: %w", err)
	}
	return conn, nil
}
