package connector

import (
	"encoding/json"

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
