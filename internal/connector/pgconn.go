package connector

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultConnectTimeout bounds a connection's setup when the document does
// not say (connectTimeoutMs).
const DefaultConnectTimeout = 10 * time.Second

// ConnTarget is a connection's parts once the url or the fields are read.
type ConnTarget struct {
	Host, Database, User, Password, SSLMode, SSLRootCert string
	Port                                                 int
	Timeout                                              time.Duration
}

// Target reads c (its url, or its fields) with password, the unsealed
// password, which wins over one in the url.
func Target(c Connection, password string) (ConnTarget, error) {
	t := ConnTarget{Host: c.Host, Port: c.Port, Database: c.Database, User: c.User, Password: password,
		SSLMode: c.SSLMode, SSLRootCert: c.SSLRootCert, Timeout: time.Duration(c.ConnectTimeoutMs) * time.Millisecond}
	if c.URL != "" {
		u, err := url.Parse(c.URL)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return t, Errorf("invalid_connector", err, "connection.url must look like postgres://user:password@host:port/database?sslmode=require")
		}
		t.Host = u.Hostname()
		if p := u.Port(); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil {
				return t, Errorf("invalid_connector", err, "connection.url has port %q; use a number", p)
			}
			t.Port = n
		}
		t.Database = strings.TrimPrefix(u.Path, "/")
		if u.User != nil {
			t.User = u.User.Username()
			if pw, ok := u.User.Password(); ok && t.Password == "" {
				t.Password = pw
			}
		}
		if m := u.Query().Get("sslmode"); m != "" {
			t.SSLMode = m
		}
	}
	if t.Port == 0 {
		t.Port = 5432
	}
	if t.SSLMode == "" {
		t.SSLMode = SSLPrefer
	}
	if t.Timeout <= 0 {
		t.Timeout = DefaultConnectTimeout
	}
	if t.Host == "" {
		return t, Errorf("invalid_connector", nil, "connection.host is empty; name the PostgreSQL server in host or url")
	}
	return t, nil
}

// ConnConfig builds a pgx configuration for t: TLS as its sslMode says,
// the session in UTC, and (unless allowPrivate) a dialer that refuses
// loopback, private and link-local addresses. It reads no PG* environment
// variables and no files.
func ConnConfig(t ConnTarget, allowPrivate bool) (*pgx.ConnConfig, error) {
	dsn := fmt.Sprintf("host=%s port=%d sslmode=disable connect_timeout=%d", quoteDSN(t.Host), t.Port,
		max(1, int((t.Timeout+time.Second-1)/time.Second)))
	if t.Database != "" {
		dsn += " dbname=" + quoteDSN(t.Database)
	}
	if t.User != "" {
		dsn += " user=" + quoteDSN(t.User)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, Errorf("invalid_connector", err, "the connection fields do not form a valid PostgreSQL address; check host, port, database and user")
	}
	cfg.Password = t.Password
	cfg.ConnectTimeout = t.Timeout
	cfg.RuntimeParams["TimeZone"] = "UTC"
	cfg.RuntimeParams["application_name"] = "queen"
	cfg.Fallbacks = nil
	switch t.SSLMode {
	case SSLDisable:
		cfg.TLSConfig = nil
	case SSLRequire:
		cfg.TLSConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // require: encrypted, not verified
	case SSLPrefer:
		cfg.TLSConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // prefer: encrypted when offered
		cfg.Fallbacks = []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port}}
	case SSLVerifyFull:
		tc := &tls.Config{ServerName: t.Host, MinVersion: tls.VersionTLS12}
		if t.SSLRootCert != "" {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM([]byte(t.SSLRootCert)) {
				return nil, Errorf("invalid_connector", nil, "connection.sslRootCert holds no PEM certificate; paste the CA certificate that signed the server's")
			}
			tc.RootCAs = pool
		}
		cfg.TLSConfig = tc
	default:
		return nil, Errorf("invalid_connector", nil, "connection.sslMode %q is not supported; use disable, prefer, require or verify-full", t.SSLMode)
	}
	if !allowPrivate {
		d := &net.Dialer{Control: refusePrivate}
		cfg.DialFunc = d.DialContext
	}
	return cfg, nil
}

func quoteDSN(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// errPrivate is what the dialer's check returns for a refused address.
var errPrivate = errors.New("private address")

// refusePrivate is a dialer Control: it sees the address actually dialed,
// so a name that resolves to a private address is refused too.
func refusePrivate(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip != nil && privateIP(ip) {
		return fmt.Errorf("%w %s", errPrivate, ip)
	}
	return nil
}

func privateIP(ip net.IP) bool {
	return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsInterfaceLocalMulticast()
}

// checkEgress resolves host and refuses it when any address is private.
func checkEgress(ctx context.Context, host string) error {
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil // the connect attempt reports the lookup failure
	}
	for _, a := range ips {
		if privateIP(a.IP) {
			return egressError(host, a.IP.String())
		}
	}
	return nil
}

func egressError(host, ip string) *Error {
	return Errorf("egress", nil, "host %s is a loopback, private or link-local address (%s) and QUEEN_PG_ALLOW_PRIVATE_NETWORKS is false; use a public address, or set QUEEN_PG_ALLOW_PRIVATE_NETWORKS=true", host, ip)
}

// connectConfig is the configuration of env's connection, plus the context
// bounding its setup.
func connectConfig(ctx context.Context, env Env) (*pgx.ConnConfig, ConnTarget, error) {
	t, err := Target(env.Doc.Connection, env.Password)
	if err != nil {
		return nil, t, err
	}
	cfg, err := ConnConfig(t, env.AllowPrivateNetworks)
	if err != nil {
		return nil, t, err
	}
	if !env.AllowPrivateNetworks {
		if err := checkEgress(ctx, t.Host); err != nil {
			return nil, t, err
		}
	}
	return cfg, t, nil
}

// Connect opens a connection for env's document. connectTimeoutMs bounds
// the whole setup (lookup, TLS, authentication, the first round trip).
func Connect(ctx context.Context, env Env) (*pgx.Conn, error) {
	cfg, t, err := connectConfig(ctx, env)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, connectError(t, err)
	}
	return conn, nil
}

// ConnectReplication opens a replication connection (replication=database)
// for env's document, for logical replication commands.
func ConnectReplication(ctx context.Context, env Env) (*pgconn.PgConn, error) {
	cfg, t, err := connectConfig(ctx, env)
	if err != nil {
		return nil, err
	}
	pc := cfg.Config.Copy()
	pc.RuntimeParams["replication"] = "database"
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, pc)
	if err != nil {
		return nil, connectError(t, err)
	}
	return conn, nil
}

// connectError names the target in a failed connect, and gives a refused
// private address its code.
func connectError(t ConnTarget, err error) error {
	if errors.Is(err, errPrivate) {
		return egressError(t.Host, "resolved at connect")
	}
	return fmt.Errorf("connect to PostgreSQL at %s:%d (database %q, user %q, sslMode %s): %w",
		t.Host, t.Port, t.Database, t.User, t.SSLMode, err)
}
