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

// Ranges and defaults of the document's fields (the connector reference).
const (
	DefaultPort             = 5432
	DefaultConnectTimeoutMs = 10000
	MinConnectTimeoutMs     = 1000
	MaxConnectTimeoutMs     = 120000
	MaxTables               = 256
	DefaultSnapshotChunk    = 2000
	MinSnapshotChunk        = 100
	MaxSnapshotChunk        = 100000
	DefaultBundleMessages   = 1000
	MaxBundleMessages       = 50000
	DefaultBundleBytes      = 4 << 20
	MinBundleBytes          = 64 << 10
	MaxBundleBytes          = 64 << 20
	DefaultLingerMs         = 20
	MaxLingerMs             = 5000
	DefaultHeartbeatSeconds = 10
	MaxHeartbeatSeconds     = 3600
	DefaultBatch            = 500
	MaxBatch                = 10000
	DefaultWorkers          = 1
	MaxWorkers              = 32
	DefaultLeaseSeconds     = 60
	MinLeaseSeconds         = 5
	MaxLeaseSeconds         = 3600
	DefaultMaxAttempts      = 3
	MaxMaxAttempts          = 100
	MaxStatementBytes       = 64 << 10
	MaxParams               = 65535
	MaxRootCertBytes        = 64 << 10
	DefaultProgressTable    = "queen.sink_progress"
)

// Input is a PUT body read and checked: the document to store (defaults
// filled in, no password), what to do with the password, and the version
// the write is conditional on.
type Input struct {
	Doc Document
	// Password is nil when the body has none (keep the stored one), ""
	// to remove it, else the new password to seal.
	Password *string
	// IfVersion is the body's "version": the write succeeds only while the
	// stored document still has it.
	IfVersion *uint64
}

// Read-only fields a read returns; a PUT may send them back (a read,
// changed, written again) and they are ignored, except name and version.
var readOnlyTop = []string{"status", "state", "deleting", "resync"}

// ParseDocument reads and validates a PUT body for connector name of
// tenant. A refused body is a *broker.Error with code invalid_connector
// and the JSON path of the field. Values outside a range are refused,
// never adjusted.
func ParseDocument(tenant, name string, body []byte) (*Input, error) {
	if err := ValidName(name); err != nil {
		return nil, invalidf("name", "%v", err)
	}
	if !json.Valid(body) {
		return nil, &broker.Error{Code: "invalid_json", Message: "the request body is not valid JSON"}
	}
	top, e := parseObj("", body)
	if e != nil {
		return nil, e
	}
	if e := top.only(append([]string{"name", "kind", "connection", "source", "sink", "version"}, readOnlyTop...)...); e != nil {
		return nil, e
	}
	in := &Input{Doc: Document{Name: name}}
	if n, ok, e := top.str("name"); e != nil {
		return nil, e
	} else if ok && n != name {
		return nil, invalidf("name", "the body names connector %q but the path names %q; they must agree (or leave name out)", n, name)
	}
	if v, ok, e := top.integer("version"); e != nil {
		return nil, e
	} else if ok {
		if v < 0 {
			return nil, invalidf("version", "version is the version a read returned, got %d", v)
		}
		u := uint64(v)
		in.IfVersion = &u
	}
	kind, ok, e := top.str("kind")
	if e != nil {
		return nil, e
	}
	if !ok {
		return nil, invalidf("kind", `kind is required: "source" or "sink"`)
	}
	if kind != KindSource && kind != KindSink {
		return nil, invalidf("kind", `kind must be "source" or "sink", got %q`, kind)
	}
	in.Doc.Kind = kind
	raw, ok := top.raw("connection")
	if !ok {
		return nil, invalidf("connection", "connection is required: host, database and user (or url), and usually a password")
	}
	conn, pw, e := parseConnection(raw)
	if e != nil {
		return nil, e
	}
	in.Doc.Connection, in.Password = conn, pw
	other := KindSink
	if kind == KindSink {
		other = KindSource
	}
	if _, ok := top.raw(other); ok {
		return nil, invalidf(other, "a %s connector has no %q block; send %q instead", kind, other, kind)
	}
	raw, ok = top.raw(kind)
	if !ok {
		return nil, invalidf(kind, "a %s connector needs its %q block", kind, kind)
	}
	if kind == KindSource {
		in.Doc.Source, e = parseSource(tenant, name, raw)
	} else {
		in.Doc.Sink, e = parseSink(name, raw)
	}
	if e != nil {
		return nil, e
	}
	return in, nil
}

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

// Partitioning of a source table (TableSpec.PartitionBy).
const (
	PartitionByKey    = "key"
	PartitionBySingle = "single"
)

// PartitionMode reads a validated PartitionBy: "key", "single", or
// "columns" with the columns.
func (t TableSpec) PartitionMode() (mode string, columns []string) {
	var s string
	if json.Unmarshal(t.PartitionBy, &s) == nil {
		if s == "" {
			return PartitionByKey, nil
		}
		return s, nil
	}
	if json.Unmarshal(t.PartitionBy, &columns) == nil && len(columns) > 0 {
		return "columns", columns
	}
	return PartitionByKey, nil
}

func parseSource(tenant, name string, raw json.RawMessage) (*SourceSpec, *broker.Error) {
	o, e := parseObj("source", raw)
	if e != nil {
		return nil, e
	}
	if e := o.only("tables", "slot", "publication", "managePublication", "snapshot", "snapshotChunkRows",
		"maxBundleMessages", "maxBundleBytes", "lingerMs", "heartbeatSeconds", "onTruncate"); e != nil {
		return nil, e
	}
	s := &SourceSpec{}
	rawTables, ok := o.raw("tables")
	if !ok {
		return nil, invalidf("source.tables", `source.tables is required: 1 to %d of {"table": "schema.name", "queue": "..."}`, MaxTables)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(rawTables, &list); err != nil {
		return nil, invalidf("source.tables", "source.tables must be an array of tables")
	}
	if len(list) < 1 || len(list) > MaxTables {
		return nil, invalidf("source.tables", "source.tables holds 1 to %d tables, got %d", MaxTables, len(list))
	}
	seen := map[string]int{}
	allSingle := true
	for i, tr := range list {
		path := fmt.Sprintf("source.tables[%d]", i)
		to, e := parseObj(path, tr)
		if e != nil {
			return nil, e
		}
		if e := to.only("table", "queue", "partitionBy"); e != nil {
			return nil, e
		}
		var t TableSpec
		var ok bool
		if t.Table, ok, e = to.str("table"); e != nil {
			return nil, e
		} else if !ok {
			return nil, invalidf(path+".table", `%s.table is required: "schema.name"`, path)
		}
		if err := validTableName(t.Table); err != nil {
			return nil, invalidf(path+".table", "%v", err)
		}
		if j, dup := seen[t.Table]; dup {
			return nil, invalidf(path+".table", "table %s is already listed as source.tables[%d]; list each table once", t.Table, j)
		}
		seen[t.Table] = i
		if t.Queue, ok, e = to.str("queue"); e != nil {
			return nil, e
		} else if !ok {
			return nil, invalidf(path+".queue", "%s.queue is required: the queue the table's changes go to", path)
		}
		if be := broker.ValidName(path+".queue", t.Queue); be != nil {
			be.Code = "invalid_connector"
			return nil, be
		}
		mode := PartitionByKey
		if pr, ok := to.raw("partitionBy"); ok {
			var str string
			var cols []string
			switch {
			case json.Unmarshal(pr, &str) == nil:
				if str != PartitionByKey && str != PartitionBySingle {
					return nil, invalidf(path+".partitionBy", `partitionBy must be "key", "single" or a list of columns, got %q`, str)
				}
				mode = str
			case json.Unmarshal(pr, &cols) == nil:
				if len(cols) == 0 {
					return nil, invalidf(path+".partitionBy", `partitionBy as a list names at least one column (or say "key" or "single")`)
				}
				dups := map[string]bool{}
				for j, c := range cols {
					if err := validIdent(c); err != nil {
						return nil, invalidf(fmt.Sprintf("%s.partitionBy[%d]", path, j), "column %v", err)
					}
					if dups[c] {
						return nil, invalidf(fmt.Sprintf("%s.partitionBy[%d]", path, j), "column %q is listed twice", c)
					}
					dups[c] = true
				}
				mode = "columns"
				pr, _ = json.Marshal(cols)
			default:
				return nil, invalidf(path+".partitionBy", `partitionBy must be "key", "single" or a list of columns`)
			}
			if mode != "columns" {
				pr, _ = json.Marshal(mode)
			}
			t.PartitionBy = pr
		} else {
			t.PartitionBy = json.RawMessage(`"key"`)
		}
		if mode != PartitionBySingle {
			allSingle = false
		}
		s.Tables = append(s.Tables, t)
	}
	def := DefaultSlotName(tenant, name)
	for _, f := range []struct {
		key string
		dst *string
	}{{"slot", &s.Slot}, {"publication", &s.Publication}} {
		v, ok, e := o.str(f.key)
		if e != nil {
			return nil, e
		}
		if !ok {
			v = def
		} else if err := validSlotName(v); err != nil {
			return nil, invalidf("source."+f.key, "source.%s %v", f.key, err)
		}
		*f.dst = v
	}
	mp, e := o.boolean("managePublication", true)
	if e != nil {
		return nil, e
	}
	s.ManagePublication = &mp
	if s.Snapshot, e = o.oneOf("snapshot", "initial", "initial", "never"); e != nil {
		return nil, e
	}
	if s.SnapshotChunkRows, e = o.intIn("snapshotChunkRows", DefaultSnapshotChunk, MinSnapshotChunk, MaxSnapshotChunk); e != nil {
		return nil, e
	}
	if s.MaxBundleMessages, e = o.intIn("maxBundleMessages", DefaultBundleMessages, 1, MaxBundleMessages); e != nil {
		return nil, e
	}
	if s.MaxBundleBytes, e = o.intIn("maxBundleBytes", DefaultBundleBytes, MinBundleBytes, MaxBundleBytes); e != nil {
		return nil, e
	}
	if s.LingerMs, e = o.intIn("lingerMs", DefaultLingerMs, 0, MaxLingerMs); e != nil {
		return nil, e
	}
	if s.HeartbeatSeconds, e = o.intIn("heartbeatSeconds", DefaultHeartbeatSeconds, 1, MaxHeartbeatSeconds); e != nil {
		return nil, e
	}
	if s.OnTruncate, e = o.oneOf("onTruncate", "skip", "skip", "emit"); e != nil {
		return nil, e
	}
	if s.OnTruncate == "emit" && !allSingle {
		return nil, invalidf("source.onTruncate", `onTruncate "emit" needs every table to be partitionBy "single": a truncate cannot be ordered against rows spread over many partitions`)
	}
	return s, nil
}

// sinkParamFacts are the @ parameters of a sql sink.
var sinkParamFacts = []string{"@partition", "@partitionId", "@offset", "@transactionId", "@createdAt"}

func parseSink(name string, raw json.RawMessage) (*SinkSpec, *broker.Error) {
	o, e := parseObj("sink", raw)
	if e != nil {
		return nil, e
	}
	if e := o.only("queue", "table", "mode", "consumerGroup", "subscriptionMode", "key", "statement", "params",
		"metadata", "batch", "workers", "leaseSeconds", "maxAttempts", "progressTable", "createProgressTable"); e != nil {
		return nil, e
	}
	s := &SinkSpec{}
	var ok bool
	if s.Queue, ok, e = o.str("queue"); e != nil {
		return nil, e
	} else if !ok {
		return nil, invalidf("sink.queue", "sink.queue is required: the queue to consume")
	}
	if be := broker.ValidName("sink.queue", s.Queue); be != nil {
		be.Code = "invalid_connector"
		return nil, be
	}
	if s.Table, ok, e = o.str("table"); e != nil {
		return nil, e
	} else if !ok {
		return nil, invalidf("sink.table", `sink.table is required: "schema.name"`)
	}
	if err := validTableName(s.Table); err != nil {
		return nil, invalidf("sink.table", "%v", err)
	}
	mode, ok, e := o.str("mode")
	if e != nil {
		return nil, e
	}
	if !ok {
		return nil, invalidf("sink.mode", `sink.mode is required: "append", "upsert", "cdc" or "sql"`)
	}
	switch mode {
	case ModeAppend, ModeUpsert, ModeCDC, ModeSQL:
	default:
		return nil, invalidf("sink.mode", `sink.mode must be "append", "upsert", "cdc" or "sql", got %q`, mode)
	}
	s.Mode = mode
	if g, ok, e := o.str("consumerGroup"); e != nil {
		return nil, e
	} else if ok {
		if be := broker.ValidName("sink.consumerGroup", g); be != nil {
			be.Code = "invalid_connector"
			return nil, be
		}
		s.ConsumerGroup = g
	} else {
		s.ConsumerGroup = "pg-" + name
	}
	if s.SubscriptionMode, e = o.oneOf("subscriptionMode", "all", "all", "new"); e != nil {
		return nil, e
	}
	if key, ok, e := o.strList("key"); e != nil {
		return nil, e
	} else if ok {
		if mode != ModeUpsert && mode != ModeCDC {
			return nil, invalidf("sink.key", `sink.key is only for mode "upsert" or "cdc"; mode %q has no key`, mode)
		}
		if len(key) == 0 {
			return nil, invalidf("sink.key", "sink.key names at least one column; leave it out to use the primary key")
		}
		if e := checkColumns("sink.key", key); e != nil {
			return nil, e
		}
		s.Key = key
	}
	stmt, hasStmt, e := o.str("statement")
	if e != nil {
		return nil, e
	}
	params, hasParams, e := o.strList("params")
	if e != nil {
		return nil, e
	}
	if mode == ModeSQL {
		if !hasStmt || strings.TrimSpace(stmt) == "" {
			return nil, invalidf("sink.statement", `mode "sql" needs sink.statement: the statement to run once per message, with $1, $2, ... for sink.params`)
		}
		if len(stmt) > MaxStatementBytes {
			return nil, invalidf("sink.statement", "sink.statement is at most %d bytes (64 KiB), got %d", MaxStatementBytes, len(stmt))
		}
		if strings.ContainsRune(stmt, 0) || !utf8.ValidString(stmt) {
			return nil, invalidf("sink.statement", "sink.statement must be UTF-8 text without NUL characters")
		}
		if len(params) > MaxParams {
			return nil, invalidf("sink.params", "sink.params holds at most %d parameters, got %d", MaxParams, len(params))
		}
		for i, p := range params {
			if err := validParam(p); err != nil {
				return nil, invalidf(fmt.Sprintf("sink.params[%d]", i), "%v", err)
			}
		}
		s.Statement, s.Params = stmt, params
	} else {
		if hasStmt {
			return nil, invalidf("sink.statement", `sink.statement is only for mode "sql"; mode %q maps the message onto the table`, mode)
		}
		if hasParams {
			return nil, invalidf("sink.params", `sink.params is only for mode "sql"`)
		}
	}
	if mr, ok := o.raw("metadata"); ok {
		if mode != ModeAppend && mode != ModeUpsert {
			return nil, invalidf("sink.metadata", `sink.metadata is only for mode "append" or "upsert"`)
		}
		var md map[string]string
		if err := json.Unmarshal(mr, &md); err != nil {
			return nil, invalidf("sink.metadata", `sink.metadata must be an object of fact to column, e.g. {"offset": "queen_offset"}`)
		}
		cols := map[string]string{}
		for fact, col := range md {
			known := false
			for _, f := range MetadataFacts {
				known = known || f == fact
			}
			if !known {
				return nil, invalidf("sink.metadata."+fact, "unknown metadata fact %q; the facts are %s", fact, strings.Join(MetadataFacts, ", "))
			}
			if err := validIdent(col); err != nil {
				return nil, invalidf("sink.metadata."+fact, "column %v", err)
			}
			if other, dup := cols[col]; dup {
				a, b := other, fact
				if b < a {
					a, b = b, a
				}
				return nil, invalidf("sink.metadata."+b, "facts %q and %q both name column %q; give each its own column", a, b, col)
			}
			cols[col] = fact
		}
		if len(md) > 0 {
			s.Metadata = md
		}
	}
	if s.Batch, e = o.intIn("batch", DefaultBatch, 1, MaxBatch); e != nil {
		return nil, e
	}
	if s.Workers, e = o.intIn("workers", DefaultWorkers, 1, MaxWorkers); e != nil {
		return nil, e
	}
	if s.LeaseSeconds, e = o.intIn("leaseSeconds", DefaultLeaseSeconds, MinLeaseSeconds, MaxLeaseSeconds); e != nil {
		return nil, e
	}
	if s.MaxAttempts, e = o.intIn("maxAttempts", DefaultMaxAttempts, 1, MaxMaxAttempts); e != nil {
		return nil, e
	}
	if pt, ok, e := o.str("progressTable"); e != nil {
		return nil, e
	} else if ok {
		if err := validTableName(pt); err != nil {
			return nil, invalidf("sink.progressTable", "%v", err)
		}
		s.ProgressTable = pt
	} else {
		s.ProgressTable = DefaultProgressTable
	}
	if s.ProgressTable == s.Table {
		return nil, invalidf("sink.progressTable", "sink.progressTable must not be the target table %s; the sink keeps its offsets there", s.Table)
	}
	cpt, e := o.boolean("createProgressTable", true)
	if e != nil {
		return nil, e
	}
	s.CreateProgressTable = &cpt
	return s, nil
}

func checkColumns(field string, cols []string) *broker.Error {
	seen := map[string]bool{}
	for i, c := range cols {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := validIdent(c); err != nil {
			return invalidf(f, "column %v", err)
		}
		if seen[c] {
			return invalidf(f, "column %q is listed twice", c)
		}
		seen[c] = true
	}
	return nil
}

// validParam checks a sql sink parameter: "$", a path such as "$.a.b" or
// "$.lines[0]", or one of the @ facts.
func validParam(p string) error {
	if strings.HasPrefix(p, "@") {
		for _, f := range sinkParamFacts {
			if p == f {
				return nil
			}
		}
		return fmt.Errorf("unknown parameter %q; the @ parameters are %s", p, strings.Join(sinkParamFacts, ", "))
	}
	if _, err := ParsePath(p); err != nil {
		return err
	}
	return nil
}

// PathStep is one step of a parameter path: a key, or an index when Key is
// empty and IsIndex is set.
type PathStep struct {
	Key     string
	Index   int
	IsIndex bool
}

// ParsePath reads "$", "$.a.b", "$.lines[0]", "$[2].x".
func ParsePath(p string) ([]PathStep, error) {
	bad := func(why string) error {
		return fmt.Errorf("parameter %q: %s; a parameter is $ (the whole message), a path such as $.a.b or $.lines[0], or one of %s", p, why, strings.Join(sinkParamFacts, ", "))
	}
	if !strings.HasPrefix(p, "$") {
		return nil, bad("it does not start with $")
	}
	var steps []PathStep
	rest := p[1:]
	for rest != "" {
		switch rest[0] {
		case '.':
			rest = rest[1:]
			end := strings.IndexAny(rest, ".[")
			if end < 0 {
				end = len(rest)
			}
			if end == 0 {
				return nil, bad("a . is not followed by a key")
			}
			steps = append(steps, PathStep{Key: rest[:end]})
			rest = rest[end:]
		case '[':
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return nil, bad("a [ is not closed")
			}
			n, err := strconv.Atoi(rest[1:end])
			if err != nil || n < 0 || rest[1] == '+' {
				return nil, bad("an index is a whole number of 0 or more")
			}
			steps = append(steps, PathStep{Index: n, IsIndex: true})
			rest = rest[end+1:]
		default:
			return nil, bad("after $ comes .key or [index]")
		}
	}
	return steps, nil
}
