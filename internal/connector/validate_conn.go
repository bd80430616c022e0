package connector

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/queen-mq/queen/internal/broker"
)

// A connector document's connection: its fields or its URL, and the checks
// on host, text and root certificate.

func parseConnection(raw json.RawMessage) (Connection, *string, *broker.Error) {
	var c Connection
	o, e := parseObj("connection", raw)
	if e != nil {
		return c, nil, e
	}
	if e := o.only("url", "host", "port", "database", "user", "password", "sslMode", "sslRootCert", "connectTimeoutMs", "passwordSet"); e != nil {
		return c, nil, e
	}
	var password *string
	if p, ok, e := o.str("password"); e != nil {
		return c, nil, e
	} else if ok {
		password = &p
	}
	sslMode, sslGiven, e := o.str("sslMode")
	if e != nil {
		return c, nil, e
	}
	u, urlGiven, e := o.str("url")
	if e != nil {
		return c, nil, e
	}
	if urlGiven {
		for _, f := range []string{"host", "port", "database", "user"} {
			if _, ok := o.raw(f); ok {
				return c, nil, invalidf("connection."+f, "give either connection.url or host, port, database and user, not both")
			}
		}
		var pw *string
		var urlSSL string
		var err error
		c.Host, c.Port, c.Database, c.User, pw, urlSSL, err = parseURL(u)
		if err != nil {
			return c, nil, invalidf("connection.url", "%v", err)
		}
		if pw != nil {
			if password != nil {
				return c, nil, invalidf("connection.password", "the url carries a password too; give it in one place")
			}
			password = pw
		}
		if urlSSL != "" {
			if sslGiven {
				return c, nil, invalidf("connection.sslMode", "the url sets sslmode too; give it in one place")
			}
			sslMode, sslGiven = urlSSL, true
		}
	} else {
		var ok bool
		if c.Host, ok, e = o.str("host"); e != nil {
			return c, nil, e
		} else if !ok {
			return c, nil, invalidf("connection.host", "connection.host is required (or give connection.url)")
		}
		if c.Port, e = o.intIn("port", DefaultPort, 1, 65535); e != nil {
			return c, nil, e
		}
		if c.Database, ok, e = o.str("database"); e != nil {
			return c, nil, e
		} else if !ok {
			return c, nil, invalidf("connection.database", "connection.database is required")
		}
		if c.User, ok, e = o.str("user"); e != nil {
			return c, nil, e
		} else if !ok {
			return c, nil, invalidf("connection.user", "connection.user is required")
		}
	}
	if err := validHost(c.Host); err != nil {
		return c, nil, invalidf(connField(urlGiven, "host"), "%v", err)
	}
	if err := validPGText(c.Database); err != nil {
		return c, nil, invalidf(connField(urlGiven, "database"), "database %v", err)
	}
	if err := validPGText(c.User); err != nil {
		return c, nil, invalidf(connField(urlGiven, "user"), "user %v", err)
	}
	if password != nil && strings.ContainsRune(*password, 0) {
		return c, nil, invalidf("connection.password", "a password cannot hold a NUL character")
	}
	if !sslGiven {
		sslMode = SSLPrefer
	}
	field := "connection.sslMode"
	if urlGiven && !o.has("sslMode") {
		field = "connection.url"
	}
	switch sslMode {
	case SSLDisable, SSLPrefer, SSLRequire, SSLVerifyFull:
	case "verify-ca":
		return c, nil, invalidf(field, `sslMode "verify-ca" is not supported: it checks the certificate but not the host name. Use "verify-full" (with sslRootCert for a private CA), or "require"`)
	default:
		return c, nil, invalidf(field, `sslMode must be "disable", "prefer", "require" or "verify-full", got %q`, sslMode)
	}
	c.SSLMode = sslMode
	if cert, ok, e := o.str("sslRootCert"); e != nil {
		return c, nil, e
	} else if ok {
		if sslMode != SSLVerifyFull {
			return c, nil, invalidf("connection.sslRootCert", `sslRootCert is used only with sslMode "verify-full", and sslMode is %q`, sslMode)
		}
		if err := validRootCert(cert); err != nil {
			return c, nil, invalidf("connection.sslRootCert", "%v", err)
		}
		c.SSLRootCert = cert
	}
	if c.ConnectTimeoutMs, e = o.intIn("connectTimeoutMs", DefaultConnectTimeoutMs, MinConnectTimeoutMs, MaxConnectTimeoutMs); e != nil {
		return c, nil, e
	}
	return c, password, nil
}

func (o obj) has(key string) bool { _, ok := o.raw(key); return ok }

func connField(urlGiven bool, f string) string {
	if urlGiven {
		return "connection.url"
	}
	return "connection." + f
}

// parseURL reads postgres://user:password@host:port/database?sslmode=...
func parseURL(s string) (host string, port int, database, user string, password *string, sslMode string, err error) {
	u, perr := url.Parse(s)
	if perr != nil {
		return "", 0, "", "", nil, "", fmt.Errorf("url is not a URL: %v", perr)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", 0, "", "", nil, "", fmt.Errorf("url must start with postgres://, e.g. postgres://user:password@host:5432/database?sslmode=require")
	}
	host = u.Hostname()
	if host == "" {
		return "", 0, "", "", nil, "", fmt.Errorf("url names no host")
	}
	port = DefaultPort
	if p := u.Port(); p != "" {
		n, perr := strconv.Atoi(p)
		if perr != nil || n < 1 || n > 65535 {
			return "", 0, "", "", nil, "", fmt.Errorf("url port must be 1-65535, got %q", p)
		}
		port = n
	}
	database = strings.TrimPrefix(u.Path, "/")
	if database == "" {
		return "", 0, "", "", nil, "", fmt.Errorf("url names no database: add /database after the host")
	}
	if u.User == nil || u.User.Username() == "" {
		return "", 0, "", "", nil, "", fmt.Errorf("url names no user: postgres://user@host/database")
	}
	user = u.User.Username()
	if p, ok := u.User.Password(); ok {
		password = &p
	}
	for k, v := range u.Query() {
		if k != "sslmode" {
			return "", 0, "", "", nil, "", fmt.Errorf("url parameter %q is not supported; the only one is sslmode (the other settings are fields of connection)", k)
		}
		if len(v) != 1 || v[0] == "" {
			return "", 0, "", "", nil, "", fmt.Errorf("url parameter sslmode must have one value")
		}
		sslMode = v[0]
	}
	if u.Fragment != "" {
		return "", 0, "", "", nil, "", fmt.Errorf("url must not have a #fragment")
	}
	return host, port, database, user, password, sslMode, nil
}

func validHost(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("host must be a host name or an IP address of 1-253 characters")
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == ':' || c == '_') {
			return fmt.Errorf("host must be one host name or IP address (found %q at byte %d); sockets and lists of hosts are not supported", c, i)
		}
	}
	return nil
}

func validPGText(s string) error {
	if s == "" || len(s) > maxPGName {
		return fmt.Errorf("must be 1-%d bytes, got %d", maxPGName, len(s))
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("must be valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("must not hold control characters")
		}
	}
	return nil
}

func validRootCert(s string) error {
	if len(s) > MaxRootCertBytes {
		return fmt.Errorf("sslRootCert is at most %d bytes, got %d", MaxRootCertBytes, len(s))
	}
	rest := []byte(s)
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("sslRootCert holds a %s block; give only the CA's certificates (-----BEGIN CERTIFICATE-----)", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("sslRootCert certificate %d does not parse: %v", n+1, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("sslRootCert must be PEM text holding the CA certificate (-----BEGIN CERTIFICATE-----)")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return fmt.Errorf("sslRootCert has text after its last certificate that is not PEM")
	}
	return nil
}
