package pgsource

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/connector"
)

// sessionSettings make PostgreSQL print every value the same way on the
// replication connection (pgoutput's text output) and on the query
// connection (the snapshot), whatever the server's defaults are.
const sessionSettings = `SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET IntervalStyle = 'postgres'; ` +
	`SET bytea_output = 'hex'; SET extra_float_digits = 1`

// connConfig builds the pgx configuration of env's connection.
func connConfig(env connector.Env) (*pgx.ConnConfig, time.Duration, error) {
	c := env.Doc.Connection
	timeout := time.Duration(c.ConnectTimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	var dsn string
	if c.URL != "" {
		u, err := url.Parse(c.URL)
		if err != nil {
			return nil, 0, connector.Errorf("invalid_connector", err, "connection.url must look like postgres://user:password@host:port/database")
		}
		dsn = u.String()
	} else {
		port := c.Port
		if port == 0 {
			port = 5432
		}
		mode := c.SSLMode
		if mode == "" {
			mode = connector.SSLPrefer
		}
		dsn = fmt.Sprintf("host=%s port=%d dbname=%s user=%s sslmode=%s", quote(c.Host), port, quote(c.Database), quote(c.User), quote(mode))
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, 0, connector.Errorf("invalid_connector", err, "the connection does not form a PostgreSQL address; check host, port, database and user")
	}
	if env.Password != "" {
		cfg.Password = env.Password
	}
	if c.SSLRootCert != "" && cfg.TLSConfig != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(c.SSLRootCert)) {
			return nil, 0, connector.Errorf("invalid_connector", nil, "connection.sslRootCert holds no PEM certificate; paste the CA certificate that signed the server's")
		}
		cfg.TLSConfig.RootCAs = pool
		for _, f := range cfg.Fallbacks {
			if f.TLSConfig != nil {
				f.TLSConfig.RootCAs = pool
			}
		}
	}
	cfg.ConnectTimeout = timeout
	cfg.RuntimeParams["application_name"] = "queen-source"
	if !env.AllowPrivateNetworks {
		// The dialer sees the address actually dialed, so a name that
		// resolves to a private address is refused too.
		d := &net.Dialer{Control: func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if ip := net.ParseIP(host); ip != nil && privateIP(ip) {
				return connector.Errorf("egress", nil, "host %s is a loopback, private or link-local address (%s) and QUEEN_PG_ALLOW_PRIVATE_NETWORKS is false; use a public address, or set QUEEN_PG_ALLOW_PRIVATE_NETWORKS=true", cfg.Host, ip)
			}
			return nil
		}}
		cfg.DialFunc = d.DialContext
	}
	return cfg, timeout, nil
}

func privateIP(ip net.IP) bool {
	return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsInterfaceLocalMulticast()
}

// connectError keeps a refused private address's code.
func connectError(what string, host string, port uint16, err error) error {
	if ce, ok := connector.AsError(err); ok {
		return ce
	}
	return fmt.Errorf("%s at %s:%d: %w", what, host, port, err)
}

func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// dialQuery opens the query connection (checks, snapshot, heartbeats).
func dialQuery(ctx context.Context, env connector.Env) (*pgx.Conn, error) {
	cfg, timeout, err := connConfig(env)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, connectError("connect to PostgreSQL", cfg.Host, cfg.Port, err)
	}
	if _, err := conn.Exec(cctx, sessionSettings); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("set the session's output formats: %w", err)
	}
	return conn, nil
}

// dialReplication opens a replication connection (replication=database).
func dialReplication(ctx context.Context, env connector.Env) (*pgconn.PgConn, error) {
	cfg, timeout, err := connConfig(env)
	if err != nil {
		return nil, err
	}
	pc := cfg.Config.Copy()
	pc.RuntimeParams["replication"] = "database"
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, pc)
	if err != nil {
		return nil, connectError("open a replication connection", pc.Host, pc.Port, err)
	}
	if _, err := conn.Exec(cctx, sessionSettings).ReadAll(); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("set the replication session's output formats: %w", err)
	}
	return conn, nil
}
