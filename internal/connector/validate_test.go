package connector

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// Tests of ParseDocument: every field and range of the connector
// reference, refused and accepted at its edges.

func sourceDoc() map[string]any {
	return map[string]any{
		"kind":       "source",
		"connection": map[string]any{"host": "pg.example.com", "database": "app", "user": "cdc", "password": "secret"},
		"source":     map[string]any{"tables": []any{map[string]any{"table": "public.orders", "queue": "orders"}}},
	}
}

func sinkDoc() map[string]any {
	return map[string]any{
		"kind":       "sink",
		"connection": map[string]any{"host": "pg.example.com", "database": "app", "user": "w"},
		"sink":       map[string]any{"queue": "orders", "table": "public.orders_copy", "mode": "upsert"},
	}
}

// del marks a path to delete.
type delMark struct{}

var del = delMark{}

var pathPart = regexp.MustCompile(`^([A-Za-z0-9_]+)((?:\[\d+\])*)$`)

// set sets (or with del, deletes) the value at a path such as
// "source.tables[0].queue".
func set(t *testing.T, doc map[string]any, path string, v any) {
	t.Helper()
	parts := strings.Split(path, ".")
	var cur any = doc
	for i, p := range parts {
		m := pathPart.FindStringSubmatch(p)
		if m == nil {
			t.Fatalf("bad test path %q", path)
		}
		key, idx := m[1], m[2]
		last := i == len(parts)-1
		obj := cur.(map[string]any)
		if idx == "" {
			if last {
				if _, isDel := v.(delMark); isDel {
					delete(obj, key)
				} else {
					obj[key] = v
				}
				return
			}
			if obj[key] == nil {
				obj[key] = map[string]any{}
			}
			cur = obj[key]
			continue
		}
		n, _ := strconv.Atoi(strings.Trim(idx, "[]"))
		list := obj[key].([]any)
		if last {
			list[n] = v
			return
		}
		cur = list[n]
	}
}

func testCert(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func tables(n int, partitionBy any) []any {
	out := make([]any, n)
	for i := range out {
		t := map[string]any{"table": fmt.Sprintf("public.t%d", i), "queue": "q"}
		if partitionBy != nil {
			t["partitionBy"] = partitionBy
		}
		out[i] = t
	}
	return out
}

type vcase struct {
	name  string
	base  func() map[string]any
	edits map[string]any // path -> value (or del)
	field string         // "" = accepted
	check func(t *testing.T, d Document)
}

func TestParseDocument(t *testing.T) {
	cert := testCert(t)
	long := func(n int) string { return strings.Repeat("a", n) }
	cases := []vcase{
		// The document itself.
		{name: "source accepted with defaults", base: sourceDoc, check: func(t *testing.T, d Document) {
			s := d.Source
			want := SourceSpec{Slot: "queen_orders_src", Publication: "queen_orders_src", Snapshot: "initial", SnapshotChunkRows: 2000,
				MaxBundleMessages: 1000, MaxBundleBytes: 4194304, LingerMs: 20, HeartbeatSeconds: 10, OnTruncate: "skip"}
			if s.Slot != want.Slot || s.Publication != want.Publication || s.Snapshot != want.Snapshot || s.SnapshotChunkRows != want.SnapshotChunkRows ||
				s.MaxBundleMessages != want.MaxBundleMessages || s.MaxBundleBytes != want.MaxBundleBytes || s.LingerMs != want.LingerMs ||
				s.HeartbeatSeconds != want.HeartbeatSeconds || s.OnTruncate != want.OnTruncate || s.ManagePublication == nil || !*s.ManagePublication {
				t.Fatalf("defaults: got %+v", s)
			}
			if m, _ := s.Tables[0].PartitionMode(); m != "key" || string(s.Tables[0].PartitionBy) != `"key"` {
				t.Fatalf("partitionBy default: %s", s.Tables[0].PartitionBy)
			}
			c := d.Connection
			if c.Port != 5432 || c.SSLMode != "prefer" || c.ConnectTimeoutMs != 10000 {
				t.Fatalf("connection defaults: %+v", c)
			}
		}},
		{name: "sink accepted with defaults", base: sinkDoc, check: func(t *testing.T, d Document) {
			s := d.Sink
			if s.ConsumerGroup != "pg-orders-src" || s.SubscriptionMode != "all" || s.Batch != 500 || s.Workers != 1 || s.LeaseSeconds != 60 ||
				s.MaxAttempts != 3 || s.ProgressTable != "queen.sink_progress" || s.CreateProgressTable == nil || !*s.CreateProgressTable || s.Key != nil {
				t.Fatalf("sink defaults: %+v", s)
			}
		}},
		{name: "kind missing", base: sourceDoc, edits: map[string]any{"kind": del}, field: "kind"},
		{name: "kind unknown", base: sourceDoc, edits: map[string]any{"kind": "pipe"}, field: "kind"},
		{name: "sink block on a source", base: sourceDoc, edits: map[string]any{"sink": map[string]any{}}, field: "sink"},
		{name: "source block missing", base: sourceDoc, edits: map[string]any{"source": del}, field: "source"},
		{name: "unknown top field", base: sourceDoc, edits: map[string]any{"colour": "red"}, field: "colour"},
		{name: "name in body differs", base: sourceDoc, edits: map[string]any{"name": "other"}, field: "name"},
		{name: "name in body agrees", base: sourceDoc, edits: map[string]any{"name": "orders-src"}},
		{name: "read-only fields sent back are ignored", base: sourceDoc, edits: map[string]any{"status": map[string]any{"phase": "error"}, "state": nil, "connection.passwordSet": true}},
		{name: "version negative", base: sourceDoc, edits: map[string]any{"version": -1}, field: "version"},
		{name: "version fractional", base: sourceDoc, edits: map[string]any{"version": 1.5}, field: "version"},

		// connection
		{name: "connection missing", base: sourceDoc, edits: map[string]any{"connection": del}, field: "connection"},
		{name: "host missing", base: sourceDoc, edits: map[string]any{"connection.host": del}, field: "connection.host"},
		{name: "host with a slash", base: sourceDoc, edits: map[string]any{"connection.host": "/var/run/postgresql"}, field: "connection.host"},
		{name: "host list", base: sourceDoc, edits: map[string]any{"connection.host": "a,b"}, field: "connection.host"},
		{name: "database missing", base: sourceDoc, edits: map[string]any{"connection.database": del}, field: "connection.database"},
		{name: "user missing", base: sourceDoc, edits: map[string]any{"connection.user": del}, field: "connection.user"},
		{name: "user 64 bytes", base: sourceDoc, edits: map[string]any{"connection.user": long(64)}, field: "connection.user"},
		{name: "port 0", base: sourceDoc, edits: map[string]any{"connection.port": 0}, field: "connection.port"},
		{name: "port 1", base: sourceDoc, edits: map[string]any{"connection.port": 1}},
		{name: "port 65535", base: sourceDoc, edits: map[string]any{"connection.port": 65535}},
		{name: "port 65536", base: sourceDoc, edits: map[string]any{"connection.port": 65536}, field: "connection.port"},
		{name: "port as a string", base: sourceDoc, edits: map[string]any{"connection.port": "5432"}, field: "connection.port"},
		{name: "password not a string", base: sourceDoc, edits: map[string]any{"connection.password": 12}, field: "connection.password"},
		{name: "sslMode disable", base: sourceDoc, edits: map[string]any{"connection.sslMode": "disable"}},
		{name: "sslMode require", base: sourceDoc, edits: map[string]any{"connection.sslMode": "require"}},
		{name: "sslMode verify-full", base: sourceDoc, edits: map[string]any{"connection.sslMode": "verify-full"}},
		{name: "sslMode verify-ca refused", base: sourceDoc, edits: map[string]any{"connection.sslMode": "verify-ca"}, field: "connection.sslMode"},
		{name: "sslMode allow refused", base: sourceDoc, edits: map[string]any{"connection.sslMode": "allow"}, field: "connection.sslMode"},
		{name: "sslRootCert with verify-full", base: sourceDoc, edits: map[string]any{"connection.sslMode": "verify-full", "connection.sslRootCert": cert},
			check: func(t *testing.T, d Document) {
				if d.Connection.SSLRootCert != cert {
					t.Fatal("sslRootCert not kept")
				}
			}},
		{name: "sslRootCert with require", base: sourceDoc, edits: map[string]any{"connection.sslMode": "require", "connection.sslRootCert": cert}, field: "connection.sslRootCert"},
		{name: "sslRootCert not PEM", base: sourceDoc, edits: map[string]any{"connection.sslMode": "verify-full", "connection.sslRootCert": "hello"}, field: "connection.sslRootCert"},
		{name: "sslRootCert a private key", base: sourceDoc, edits: map[string]any{"connection.sslMode": "verify-full",
			"connection.sslRootCert": string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2}}))}, field: "connection.sslRootCert"},
		{name: "connectTimeoutMs 999", base: sourceDoc, edits: map[string]any{"connection.connectTimeoutMs": 999}, field: "connection.connectTimeoutMs"},
		{name: "connectTimeoutMs 1000", base: sourceDoc, edits: map[string]any{"connection.connectTimeoutMs": 1000}},
		{name: "connectTimeoutMs 120000", base: sourceDoc, edits: map[string]any{"connection.connectTimeoutMs": 120000}},
		{name: "connectTimeoutMs 120001", base: sourceDoc, edits: map[string]any{"connection.connectTimeoutMs": 120001}, field: "connection.connectTimeoutMs"},
		{name: "connectTimeoutMs fractional", base: sourceDoc, edits: map[string]any{"connection.connectTimeoutMs": 1500.5}, field: "connection.connectTimeoutMs"},
		{name: "unknown connection field", base: sourceDoc, edits: map[string]any{"connection.sslmode": "require"}, field: "connection.sslmode"},
		{name: "url form", base: sourceDoc, edits: map[string]any{"connection": map[string]any{"url": "postgres://cdc:pw@db.example.com:6543/app?sslmode=require"}},
			check: func(t *testing.T, d Document) {
				c := d.Connection
				if c.Host != "db.example.com" || c.Port != 6543 || c.Database != "app" || c.User != "cdc" || c.SSLMode != "require" || c.URL != "" {
					t.Fatalf("url form: %+v", c)
				}
			}},
		{name: "url and host", base: sourceDoc, edits: map[string]any{"connection.url": "postgres://u@h/d"}, field: "connection.host"},
		{name: "url wrong scheme", base: sourceDoc, edits: map[string]any{"connection": map[string]any{"url": "mysql://u@h/d"}}, field: "connection.url"},
		{name: "url without database", base: sourceDoc, edits: map[string]any{"connection": map[string]any{"url": "postgres://u@h"}}, field: "connection.url"},
		{name: "url with another parameter", base: sourceDoc, edits: map[string]any{"connection": map[string]any{"url": "postgres://u@h/d?application_name=x"}}, field: "connection.url"},
		{name: "url verify-ca", base: sourceDoc, edits: map[string]any{"connection": map[string]any{"url": "postgres://u@h/d?sslmode=verify-ca"}}, field: "connection.url"},
		{name: "url and password field both", base: sourceDoc, edits: map[string]any{"connection": map[string]any{"url": "postgres://u:a@h/d", "password": "b"}}, field: "connection.password"},

		// source
		{name: "tables missing", base: sourceDoc, edits: map[string]any{"source.tables": del}, field: "source.tables"},
		{name: "tables empty", base: sourceDoc, edits: map[string]any{"source.tables": []any{}}, field: "source.tables"},
		{name: "tables 256", base: sourceDoc, edits: map[string]any{"source.tables": tables(256, nil)}},
		{name: "tables 257", base: sourceDoc, edits: map[string]any{"source.tables": tables(257, nil)}, field: "source.tables"},
		{name: "table without schema", base: sourceDoc, edits: map[string]any{"source.tables[0].table": "orders"}, field: "source.tables[0].table"},
		{name: "table with two dots", base: sourceDoc, edits: map[string]any{"source.tables[0].table": "a.b.c"}, field: "source.tables[0].table"},
		{name: "table listed twice", base: sourceDoc, edits: map[string]any{"source.tables": []any{
			map[string]any{"table": "public.a", "queue": "q"}, map[string]any{"table": "public.a", "queue": "r"}}}, field: "source.tables[1].table"},
		{name: "table queue missing", base: sourceDoc, edits: map[string]any{"source.tables[0].queue": del}, field: "source.tables[0].queue"},
		{name: "table queue invalid", base: sourceDoc, edits: map[string]any{"source.tables[0].queue": "a b"}, field: "source.tables[0].queue"},
		{name: "table unknown field", base: sourceDoc, edits: map[string]any{"source.tables[0].key": "id"}, field: "source.tables[0].key"},
		{name: "partitionBy single", base: sourceDoc, edits: map[string]any{"source.tables[0].partitionBy": "single"}},
		{name: "partitionBy columns", base: sourceDoc, edits: map[string]any{"source.tables[0].partitionBy": []any{"customer_id", "region"}},
			check: func(t *testing.T, d Document) {
				if m, cols := d.Source.Tables[0].PartitionMode(); m != "columns" || len(cols) != 2 || cols[0] != "customer_id" {
					t.Fatalf("partitionBy columns: %s %v", m, cols)
				}
			}},
		{name: "partitionBy unknown word", base: sourceDoc, edits: map[string]any{"source.tables[0].partitionBy": "row"}, field: "source.tables[0].partitionBy"},
		{name: "partitionBy empty list", base: sourceDoc, edits: map[string]any{"source.tables[0].partitionBy": []any{}}, field: "source.tables[0].partitionBy"},
		{name: "partitionBy duplicate column", base: sourceDoc, edits: map[string]any{"source.tables[0].partitionBy": []any{"a", "a"}}, field: "source.tables[0].partitionBy[1]"},
		{name: "partitionBy number", base: sourceDoc, edits: map[string]any{"source.tables[0].partitionBy": 3}, field: "source.tables[0].partitionBy"},
		{name: "slot given", base: sourceDoc, edits: map[string]any{"source.slot": "my_slot"}, check: func(t *testing.T, d Document) {
			if d.Source.Slot != "my_slot" || d.Source.Publication != "queen_orders_src" {
				t.Fatalf("slot %q publication %q", d.Source.Slot, d.Source.Publication)
			}
		}},
		{name: "slot 63", base: sourceDoc, edits: map[string]any{"source.slot": long(63)}},
		{name: "slot 64", base: sourceDoc, edits: map[string]any{"source.slot": long(64)}, field: "source.slot"},
		{name: "slot uppercase", base: sourceDoc, edits: map[string]any{"source.slot": "Slot"}, field: "source.slot"},
		{name: "slot with a dash", base: sourceDoc, edits: map[string]any{"source.slot": "my-slot"}, field: "source.slot"},
		{name: "publication 64", base: sourceDoc, edits: map[string]any{"source.publication": long(64)}, field: "source.publication"},
		{name: "managePublication false", base: sourceDoc, edits: map[string]any{"source.managePublication": false}, check: func(t *testing.T, d Document) {
			if *d.Source.ManagePublication {
				t.Fatal("managePublication false not kept")
			}
		}},
		{name: "managePublication a string", base: sourceDoc, edits: map[string]any{"source.managePublication": "no"}, field: "source.managePublication"},
		{name: "snapshot never", base: sourceDoc, edits: map[string]any{"source.snapshot": "never"}},
		{name: "snapshot unknown", base: sourceDoc, edits: map[string]any{"source.snapshot": "always"}, field: "source.snapshot"},
		{name: "onTruncate emit with key tables", base: sourceDoc, edits: map[string]any{"source.onTruncate": "emit"}, field: "source.onTruncate"},
		{name: "onTruncate emit with single tables", base: sourceDoc, edits: map[string]any{"source.onTruncate": "emit", "source.tables": tables(3, "single")}},
		{name: "onTruncate emit with one key table", base: sourceDoc, edits: map[string]any{"source.onTruncate": "emit",
			"source.tables": append(tables(2, "single"), map[string]any{"table": "public.z", "queue": "q"})}, field: "source.onTruncate"},
		{name: "onTruncate unknown", base: sourceDoc, edits: map[string]any{"source.onTruncate": "drop"}, field: "source.onTruncate"},
		{name: "unknown source field", base: sourceDoc, edits: map[string]any{"source.chunkRows": 5}, field: "source.chunkRows"},

		// sink
		{name: "sink queue missing", base: sinkDoc, edits: map[string]any{"sink.queue": del}, field: "sink.queue"},
		{name: "sink queue invalid", base: sinkDoc, edits: map[string]any{"sink.queue": "a/b"}, field: "sink.queue"},
		{name: "sink table missing", base: sinkDoc, edits: map[string]any{"sink.table": del}, field: "sink.table"},
		{name: "sink table without schema", base: sinkDoc, edits: map[string]any{"sink.table": "orders"}, field: "sink.table"},
		{name: "mode missing", base: sinkDoc, edits: map[string]any{"sink.mode": del}, field: "sink.mode"},
		{name: "mode unknown", base: sinkDoc, edits: map[string]any{"sink.mode": "merge"}, field: "sink.mode"},
		{name: "mode append", base: sinkDoc, edits: map[string]any{"sink.mode": "append"}},
		{name: "mode cdc", base: sinkDoc, edits: map[string]any{"sink.mode": "cdc"}},
		{name: "consumerGroup given", base: sinkDoc, edits: map[string]any{"sink.consumerGroup": "mine"}, check: func(t *testing.T, d Document) {
			if d.Sink.ConsumerGroup != "mine" {
				t.Fatal(d.Sink.ConsumerGroup)
			}
		}},
		{name: "consumerGroup invalid", base: sinkDoc, edits: map[string]any{"sink.consumerGroup": "a b"}, field: "sink.consumerGroup"},
		{name: "subscriptionMode new", base: sinkDoc, edits: map[string]any{"sink.subscriptionMode": "new"}},
		{name: "subscriptionMode unknown", base: sinkDoc, edits: map[string]any{"sink.subscriptionMode": "latest"}, field: "sink.subscriptionMode"},
		{name: "key with upsert", base: sinkDoc, edits: map[string]any{"sink.key": []any{"id"}}},
		{name: "key with cdc", base: sinkDoc, edits: map[string]any{"sink.mode": "cdc", "sink.key": []any{"id", "region"}}},
		{name: "key with append", base: sinkDoc, edits: map[string]any{"sink.mode": "append", "sink.key": []any{"id"}}, field: "sink.key"},
		{name: "key with sql", base: sinkDoc, edits: map[string]any{"sink.mode": "sql", "sink.statement": "SELECT 1", "sink.key": []any{"id"}}, field: "sink.key"},
		{name: "key empty", base: sinkDoc, edits: map[string]any{"sink.key": []any{}}, field: "sink.key"},
		{name: "key duplicate", base: sinkDoc, edits: map[string]any{"sink.key": []any{"id", "id"}}, field: "sink.key[1]"},
		{name: "statement with upsert", base: sinkDoc, edits: map[string]any{"sink.statement": "SELECT 1"}, field: "sink.statement"},
		{name: "params with append", base: sinkDoc, edits: map[string]any{"sink.mode": "append", "sink.params": []any{"$"}}, field: "sink.params"},
		{name: "sql without statement", base: sinkDoc, edits: map[string]any{"sink.mode": "sql"}, field: "sink.statement"},
		{name: "sql statement 64 KiB", base: sinkDoc, edits: map[string]any{"sink.mode": "sql", "sink.statement": "SELECT 1" + strings.Repeat(" ", 64<<10-8)}},
		{name: "sql statement over 64 KiB", base: sinkDoc, edits: map[string]any{"sink.mode": "sql", "sink.statement": "SELECT 1" + strings.Repeat(" ", 64<<10-7)}, field: "sink.statement"},
		{name: "sql params", base: sinkDoc, edits: map[string]any{"sink.mode": "sql", "sink.statement": "SELECT $1",
			"sink.params": []any{"$", "$.a.b", "$.lines[0]", "$.lines[0].sku", "@partition", "@partitionId", "@offset", "@transactionId", "@createdAt"}}},
		{name: "sql param without $", base: sinkDoc, edits: map[string]any{"sink.mode": "sql", "sink.statement": "SELECT $1", "sink.params": []any{"$", "a.b"}}, field: "sink.params[1]"},
		{name: "sql param bad index", base: sinkDoc, edits: map[string]any{"sink.mode": "sql", "sink.statement": "SELECT $1", "sink.params": []any{"$.a[x]"}}, field: "sink.params[0]"},
		{name: "sql param unknown fact", base: sinkDoc, edits: map[string]any{"sink.mode": "sql", "sink.statement": "SELECT $1", "sink.params": []any{"@queue"}}, field: "sink.params[0]"},
		{name: "metadata with append", base: sinkDoc, edits: map[string]any{"sink.mode": "append", "sink.metadata": map[string]any{"offset": "queen_offset", "payload": "doc"}}},
		{name: "metadata with upsert", base: sinkDoc, edits: map[string]any{"sink.metadata": map[string]any{"partition": "p"}}},
		{name: "metadata with cdc", base: sinkDoc, edits: map[string]any{"sink.mode": "cdc", "sink.metadata": map[string]any{"offset": "o"}}, field: "sink.metadata"},
		{name: "metadata unknown fact", base: sinkDoc, edits: map[string]any{"sink.metadata": map[string]any{"queue": "q"}}, field: "sink.metadata.queue"},
		{name: "metadata bad column", base: sinkDoc, edits: map[string]any{"sink.metadata": map[string]any{"offset": "a b"}}, field: "sink.metadata.offset"},
		{name: "metadata shared column", base: sinkDoc, edits: map[string]any{"sink.metadata": map[string]any{"offset": "c", "partition": "c"}}, field: "sink.metadata.partition"},
		{name: "metadata not an object", base: sinkDoc, edits: map[string]any{"sink.metadata": []any{"offset"}}, field: "sink.metadata"},
		{name: "progressTable the target", base: sinkDoc, edits: map[string]any{"sink.progressTable": "public.orders_copy"}, field: "sink.progressTable"},
		{name: "progressTable given", base: sinkDoc, edits: map[string]any{"sink.progressTable": "ops.progress"}},
		{name: "progressTable without schema", base: sinkDoc, edits: map[string]any{"sink.progressTable": "progress"}, field: "sink.progressTable"},
		{name: "createProgressTable false", base: sinkDoc, edits: map[string]any{"sink.createProgressTable": false}, check: func(t *testing.T, d Document) {
			if *d.Sink.CreateProgressTable {
				t.Fatal("createProgressTable false not kept")
			}
		}},
		{name: "unknown sink field", base: sinkDoc, edits: map[string]any{"sink.workerCount": 2}, field: "sink.workerCount"},
	}
	// The numeric ranges, each at both edges and one past them.
	ranges := []struct {
		base   func() map[string]any
		path   string
		lo, hi int64
	}{
		{sourceDoc, "source.snapshotChunkRows", 100, 100000},
		{sourceDoc, "source.maxBundleMessages", 1, 50000},
		{sourceDoc, "source.maxBundleBytes", 64 << 10, 64 << 20},
		{sourceDoc, "source.lingerMs", 0, 5000},
		{sourceDoc, "source.heartbeatSeconds", 1, 3600},
		{sinkDoc, "sink.batch", 1, 10000},
		{sinkDoc, "sink.workers", 1, 32},
		{sinkDoc, "sink.leaseSeconds", 5, 3600},
		{sinkDoc, "sink.maxAttempts", 1, 100},
	}
	for _, r := range ranges {
		for _, v := range []struct {
			n  int64
			ok bool
		}{{r.lo - 1, false}, {r.lo, true}, {r.hi, true}, {r.hi + 1, false}} {
			c := vcase{name: fmt.Sprintf("%s %d", r.path, v.n), base: r.base, edits: map[string]any{r.path: v.n}}
			if !v.ok {
				c.field = r.path
			} else {
				path, n := r.path, v.n
				c.check = func(t *testing.T, d Document) {
					b, _ := json.Marshal(d)
					var m map[string]any
					json.Unmarshal(b, &m)
					parts := strings.Split(path, ".")
					if got := m[parts[0]].(map[string]any)[parts[1]]; got != float64(n) {
						t.Fatalf("%s stored as %v, want %d", path, got, n)
					}
				}
			}
			cases = append(cases, c)
		}
		cases = append(cases, vcase{name: r.path + " fractional", base: r.base, edits: map[string]any{r.path: float64(r.lo) + 0.5}, field: r.path})
		cases = append(cases, vcase{name: r.path + " string", base: r.base, edits: map[string]any{r.path: strconv.FormatInt(r.lo, 10)}, field: r.path})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := c.base()
			for p, v := range c.edits {
				set(t, doc, p, v)
			}
			body, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			in, err := ParseDocument("default", "orders-src", body)
			if c.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if c.check != nil {
					c.check(t, in.Doc)
				}
				return
			}
			var be *broker.Error
			if !errors.As(err, &be) {
				t.Fatalf("want a refusal naming %s, got %v", c.field, err)
			}
			if be.Code != "invalid_connector" || be.Field != c.field {
				t.Fatalf("want invalid_connector field %s, got %s field %q: %s", c.field, be.Code, be.Field, be.Message)
			}
			if be.Message == "" {
				t.Fatal("a refusal without a message")
			}
		})
	}
}

func TestParseDocumentPassword(t *testing.T) {
	for _, c := range []struct {
		name string
		conn map[string]any
		want *string
	}{
		{"omitted keeps", map[string]any{"host": "h", "database": "d", "user": "u"}, nil},
		{"empty removes", map[string]any{"host": "h", "database": "d", "user": "u", "password": ""}, ptr("")},
		{"given", map[string]any{"host": "h", "database": "d", "user": "u", "password": "p"}, ptr("p")},
		{"from the url", map[string]any{"url": "postgres://u:p%40ss@h/d"}, ptr("p@ss")},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := sinkDoc()
			doc["connection"] = c.conn
			body, _ := json.Marshal(doc)
			in, err := ParseDocument("default", "s", body)
			if err != nil {
				t.Fatal(err)
			}
			if (in.Password == nil) != (c.want == nil) || (c.want != nil && *in.Password != *c.want) {
				t.Fatalf("password %v, want %v", in.Password, c.want)
			}
			if b, _ := json.Marshal(in.Doc); strings.Contains(string(b), `"p"`) || strings.Contains(string(b), "p@ss") {
				t.Fatalf("the document holds the password in the clear: %s", b)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestParseDocumentNames(t *testing.T) {
	body, _ := json.Marshal(sinkDoc())
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"a", true}, {"0", true}, {"orders-src_2", true}, {strings.Repeat("a", 48), true},
		{"", false}, {strings.Repeat("a", 49), false}, {"-a", false}, {"_a", false}, {"Orders", false}, {"a.b", false}, {"a/b", false}, {"a b", false},
	} {
		_, err := ParseDocument("default", c.name, body)
		if c.ok != (err == nil) {
			t.Errorf("name %q: ok=%v, got %v", c.name, c.ok, err)
		}
		var be *broker.Error
		if err != nil && (!errors.As(err, &be) || be.Code != "invalid_connector" || be.Field != "name") {
			t.Errorf("name %q: want invalid_connector on name, got %v", c.name, err)
		}
	}
	if _, err := ParseDocument("default", "x", []byte(`{"kind": `)); err == nil {
		t.Error("invalid JSON accepted")
	}
	if _, err := ParseDocument("default", "x", []byte(`[1]`)); err == nil {
		t.Error("an array accepted as a document")
	}
}

func TestDefaultSlotNameTenantSafe(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	if got := DefaultSlotName("default", "orders-src"); got != "queen_orders_src" {
		t.Fatalf("default tenant: %q", got)
	}
	names := []string{"orders", "orders-src", "orders_src", strings.Repeat("x", 48), strings.Repeat("x", 47) + "y"}
	tenants := []string{"default", "alpha", "beta", "a_b", "a", "ALPHA", "x:y.z-w"}
	seen := map[string]string{}
	for _, tn := range tenants {
		for _, n := range names {
			s := DefaultSlotName(tn, n)
			if !valid.MatchString(s) {
				t.Errorf("%s/%s: %q is not a valid slot name", tn, n, s)
			}
			if other, dup := seen[s]; dup && !(tn == "default" && (n == "orders-src" || n == "orders_src")) {
				t.Errorf("%s/%s and %s derive the same slot %q", tn, n, other, s)
			}
			seen[s] = tn + "/" + n
		}
	}
	if DefaultSlotName("alpha", "orders") == DefaultSlotName("beta", "orders") {
		t.Fatal("two tenants' connectors of one name derive one slot")
	}
	if DefaultSlotName("alpha", "orders-src") == DefaultSlotName("alpha", "orders_src") {
		t.Fatal("outside tenant default, - and _ must not meet in one slot name")
	}
	// Parsed documents carry the derived names.
	body, _ := json.Marshal(sourceDoc())
	a, _ := ParseDocument("alpha", "orders-src", body)
	b, _ := ParseDocument("beta", "orders-src", body)
	if a.Doc.Source.Slot == b.Doc.Source.Slot || a.Doc.Source.Publication == b.Doc.Source.Publication {
		t.Fatalf("tenants alpha and beta share slot %q", a.Doc.Source.Slot)
	}
}

func TestParseDocumentWholeNumbers(t *testing.T) {
	for _, c := range []struct {
		port string
		want int
		ok   bool
	}{{"1e3", 1000, true}, {"1000.0", 1000, true}, {"1000.5", 0, false}, {"1e30", 0, false}, {"-0", 0, false}} {
		body := `{"kind":"sink","connection":{"host":"h","database":"d","user":"u","port":` + c.port + `},"sink":{"queue":"q","table":"a.b","mode":"append"}}`
		in, err := ParseDocument("default", "s", []byte(body))
		if c.ok != (err == nil) || (c.ok && in.Doc.Connection.Port != c.want) {
			t.Errorf("port %s: ok=%v want %d, got %v %+v", c.port, c.ok, c.want, err, in)
		}
	}
}
