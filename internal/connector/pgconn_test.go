package connector

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
)

func envOf(c Connection, password string, allowPrivate bool) Env {
	return Env{Doc: Document{Name: "x", Kind: KindSink, Connection: c}, Password: password, AllowPrivateNetworks: allowPrivate}
}

// sslOf reports whether the session is encrypted, and its TimeZone.
func sessionOf(t *testing.T, env Env) (bool, string) {
	t.Helper()
	ctx := context.Background()
	conn, err := Connect(ctx, env)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	var ssl bool
	var tz string
	if err := conn.QueryRow(ctx, `SELECT ssl, current_setting('TimeZone') FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &tz); err != nil {
		t.Fatal(err)
	}
	return ssl, tz
}

// TestConnectSSLModes against a PostgreSQL with ssl=on: require and prefer
// encrypt, disable does not, verify-full checks the certificate against
// sslRootCert (and refuses another CA), verify-ca is refused; every
// session runs in UTC.
func TestConnectSSLModes(t *testing.T) {
	pg := pgtest.Private(t, pgtest.Options{SSL: true})
	other := pgtest.Private(t, pgtest.Options{SSL: true})
	fields := Connection{Host: "localhost", Port: pg.Port(), Database: "postgres", User: "postgres", ConnectTimeoutMs: 10000}
	for _, c := range []struct {
		mode string
		ca   []byte
		ssl  bool
	}{{SSLDisable, nil, false}, {SSLPrefer, nil, true}, {SSLRequire, nil, true}, {SSLVerifyFull, pg.CACertPEM(), true}} {
		conn := fields
		conn.SSLMode, conn.SSLRootCert = c.mode, string(c.ca)
		ssl, tz := sessionOf(t, envOf(conn, pgtest.Password, true))
		if ssl != c.ssl || tz != "UTC" {
			t.Fatalf("sslMode %s: encrypted %v TimeZone %s, want %v UTC", c.mode, ssl, tz, c.ssl)
		}
	}
	// The url form, its password and sslmode.
	u := strings.Replace(pg.URL("postgres"), "sslmode=disable", "sslmode=require", 1)
	if ssl, _ := sessionOf(t, envOf(Connection{URL: u}, "", true)); !ssl {
		t.Fatal("url with sslmode=require: not encrypted")
	}
	ctx := context.Background()
	wrong := fields
	wrong.SSLMode, wrong.SSLRootCert = SSLVerifyFull, string(other.CACertPEM())
	if _, err := Connect(ctx, envOf(wrong, pgtest.Password, true)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("verify-full with another CA: %v, want a certificate error", err)
	}
	noCA := fields
	noCA.SSLMode = SSLVerifyFull
	if _, err := Connect(ctx, envOf(noCA, pgtest.Password, true)); err == nil {
		t.Fatal("verify-full against a private CA without sslRootCert connected")
	}
	ca := fields
	ca.SSLMode = "verify-ca"
	_, err := Connect(ctx, envOf(ca, pgtest.Password, true))
	if ce, ok := AsError(err); !ok || ce.Code != "invalid_connector" || !strings.Contains(ce.Message, "verify-full") {
		t.Fatalf("verify-ca: %v, want invalid_connector naming the modes", err)
	}
}

// TestConnectEgress: with private networks not allowed, loopback and
// private hosts are refused with code egress before anything is sent.
func TestConnectEgress(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "localhost", "10.1.2.3", "192.168.0.1", "169.254.1.1", "::1"} {
		start := time.Now()
		_, err := Connect(context.Background(), envOf(Connection{Host: host, Database: "d", User: "u", SSLMode: SSLDisable, ConnectTimeoutMs: 2000}, "", false))
		ce, ok := AsError(err)
		if !ok || ce.Code != "egress" || !strings.Contains(ce.Message, "QUEEN_PG_ALLOW_PRIVATE_NETWORKS") {
			t.Fatalf("host %s: %v, want code egress", host, err)
		}
		if time.Since(start) > time.Second {
			t.Fatalf("host %s: refused only after %v", host, time.Since(start))
		}
	}
	// The dialer refuses too (a name resolving elsewhere at connect time).
	if err := refusePrivate("tcp", "10.0.0.1:5432", nil); err == nil {
		t.Fatal("dialer check let 10.0.0.1 through")
	}
	if err := refusePrivate("tcp", "8.8.8.8:5432", nil); err != nil {
		t.Fatalf("dialer check refused a public address: %v", err)
	}
}

// TestConnectTimeout: connectTimeoutMs bounds the whole setup, here
// against a listener that never answers.
func TestConnectTimeout(t *testing.T) {
	ln := listenSilent(t)
	host, port := splitHostPort(t, ln)
	start := time.Now()
	_, err := Connect(context.Background(), envOf(Connection{Host: host, Port: port, Database: "d", User: "u", SSLMode: SSLDisable, ConnectTimeoutMs: 1000}, "", true))
	if err == nil {
		t.Fatal("connected to a silent listener")
	}
	if el := time.Since(start); el < 900*time.Millisecond || el > 5*time.Second {
		t.Fatalf("gave up after %v, want about 1 s", el)
	}
}
