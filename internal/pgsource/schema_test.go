package pgsource

import (
	"strings"
	"testing"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

// TestSchemaChanges: a column added while the source runs shows up as a
// new field; a table added to the document is streamed from then on, not
// copied; a table removed from it stops.
func TestSchemaChanges(t *testing.T) {
	s, db := ordersSource(t)
	s.Exec(t, db, "CREATE TABLE extra (id int PRIMARY KEY); INSERT INTO extra VALUES (1), (2)")
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "schema", connector.TableSpec{Table: "public.orders", Queue: "orders"})
	src := startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	drain(t, b, "orders", "g", 2)
	s.Exec(t, db, "ALTER TABLE orders ADD COLUMN note text DEFAULT 'hi'; UPDATE orders SET status = 'x' WHERE id = 1")
	if evs := drain(t, b, "orders", "g", 1); string(evs[0].ev.After["note"]) != `"hi"` {
		t.Fatalf("no new field: %s", evs[0].msg.Data)
	}
	src.stop(t)

	// The document now names extra too, and no longer orders.
	doc.Source.Tables = []connector.TableSpec{{Table: "public.extra", Queue: "extra"}}
	doc.Version++
	src = startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	s.Exec(t, db, "INSERT INTO extra VALUES (3); UPDATE orders SET status = 'y' WHERE id = 1; INSERT INTO extra VALUES (4)")
	evs := drain(t, b, "extra", "g", 2)
	for i, g := range evs {
		if g.ev.Op != "c" || string(g.ev.Key["id"]) != []string{"3", "4"}[i] {
			t.Fatalf("extra: %s (its existing rows must not be copied)", g.msg.Data)
		}
	}
	if res := drain(t, b, "orders", "g", 0); len(res) != 0 {
		t.Fatalf("a removed table still streams: %s", res[0].msg.Data)
	}
}

// TestVerifiedTLS: with sslMode verify-full and the server's CA in
// sslRootCert, the source's connections are encrypted and verified.
func TestVerifiedTLS(t *testing.T) {
	s := pgtest.Private(t, pgtest.Options{SSL: true})
	s.Exec(t, "postgres", ordersDDL)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, "postgres", "tls", connector.TableSpec{Table: "public.orders", Queue: "orders"})
	doc.Connection = connector.Connection{Host: "127.0.0.1", Port: s.Port(), Database: "postgres", User: "postgres",
		SSLMode: connector.SSLVerifyFull, SSLRootCert: string(s.CACertPEM())}
	src := startSourceEnv(t, connector.Env{Broker: b, Tenant: "default", Doc: doc, NodeID: "n1", AllowPrivateNetworks: true, Password: pgtest.Password}, nil)
	src.waitPhase(t, connector.PhaseStreaming)
	drain(t, b, "orders", "g", 2)
	if n := count(t, s, "postgres", "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE ssl AND application_name = 'queen'"); n < 2 {
		t.Fatalf("%d encrypted source connections, want the query and the replication one", n)
	}
	// A wrong CA is refused.
	other := pgtest.Private(t, pgtest.Options{SSL: true})
	bad := doc
	bad.Name = "tls-bad"
	bad.Connection.SSLRootCert = string(other.CACertPEM())
	st := startSourceEnv(t, connector.Env{Broker: b, Tenant: "default", Doc: bad, NodeID: "n1", AllowPrivateNetworks: true, Password: pgtest.Password}, nil).waitError(t)
	if !strings.Contains(st.Message, "certificate") {
		t.Fatalf("status %s: %s", st.Code, st.Message)
	}
}
