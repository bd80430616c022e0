package pgsource

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgsink"
	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestThroughTheRuntime: the walkthrough's document, stored as a PUT
// stores it, is run by the connector runtime with this package's factory:
// the source streams, its pointer and lease are readable, a cdc sink
// (internal/pgsink) copies the table exactly through the walkthrough's
// changes, a resync copies the rows again under a new epoch, and a DELETE
// drops the slot and the publication before the document goes.
func TestThroughTheRuntime(t *testing.T) {
	s, db := ordersSource(t)
	b, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: t.TempDir(), RaftAddr: testkit.FreeAddr(t)},
		EncryptionKey: strings.Repeat("ab", 32)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	settings := connector.DefaultSettings()
	settings.Reload = 200 * time.Millisecond
	rt := connector.NewRuntime(connector.RuntimeConfig{Broker: b, Settings: settings,
		Factories: map[string]connector.Factory{connector.KindSource: New, connector.KindSink: pgsink.New}})
	rt.Start()
	defer rt.Stop()
	store := connector.NewStore(b)
	body := fmt.Sprintf(`{"kind": "source",
  "connection": {"host": "127.0.0.1", "port": %d, "database": %q, "user": "postgres", "password": %q, "sslMode": "disable"},
  "source": {"tables": [{"table": "public.orders", "queue": "orders"}]}}`, s.Port(), db, pgtest.Password)
	if _, err := store.Put(ctx, "default", "orders-src", []byte(body)); err != nil {
		t.Fatal(err)
	}
	rt.Kick()
	status := func() connector.Status {
		doc, ok, err := store.Get(ctx, "default", "orders-src")
		if err != nil || !ok {
			return connector.Status{Phase: "gone"}
		}
		return rt.Status("default", doc)
	}
	waitStatus := func(phase string) {
		t.Helper()
		if err := waitFor(func() error {
			if st := status(); st.Phase != phase {
				return fmt.Errorf("phase %s (%s %s)", st.Phase, st.Code, st.Message)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitStatus(connector.PhaseStreaming)
	first := drain(t, b, "orders", "reader", 2)
	state, err := store.State(ctx, "default", "orders-src")
	if err != nil {
		t.Fatal(err)
	}
	var p pointer
	if err := json.Unmarshal(state.Pointer, &p); err != nil || p.Epoch == "" || !p.Snapshot.Done {
		t.Fatalf("state.pointer %s (%v)", state.Pointer, err)
	}
	if js, _ := json.Marshal(state); !strings.Contains(string(js), b.Node().ID()) {
		t.Fatalf("state %s does not name this node as the lease holder", js)
	}

	// The walkthrough's changes, and a cdc sink copying the table.
	s.Exec(t, db, "CREATE TABLE orders_copy (LIKE orders INCLUDING ALL)")
	sink := fmt.Sprintf(`{"kind": "sink",
  "connection": {"host": "127.0.0.1", "port": %d, "database": %q, "user": "postgres", "password": %q, "sslMode": "disable"},
  "sink": {"queue": "orders", "table": "public.orders_copy", "mode": "cdc"}}`, s.Port(), db, pgtest.Password)
	if _, err := store.Put(ctx, "default", "orders-copy", []byte(sink)); err != nil {
		t.Fatal(err)
	}
	rt.Kick()
	s.Exec(t, db, `UPDATE orders SET status = 'paid' WHERE id = 1`)
	s.Exec(t, db, `BEGIN;
INSERT INTO orders (id, customer, status, total) VALUES (3, '{"name": "Grace", "tier": "gold"}', 'new', 99.90);
DELETE FROM orders WHERE id = 2;
COMMIT;`)
	drain(t, b, "orders", "reader", 3)
	pc := s.Connect(t, db)
	if err := waitFor(func() error {
		var n int
		if err := pc.QueryRow(ctx, `SELECT count(*) FROM ((TABLE orders EXCEPT TABLE orders_copy) UNION ALL (TABLE orders_copy EXCEPT TABLE orders)) d`).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("%d rows differ between orders and orders_copy", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s, db, "SELECT count(*) FROM orders_copy WHERE id IN (1, 3)"); n != 2 {
		t.Fatalf("the copy holds %d of rows 1 and 3", n)
	}
	if _, err := store.Delete(ctx, "default", "orders-copy", true); err != nil {
		t.Fatal(err)
	}

	if _, err := store.Resync(ctx, "default", "orders-src"); err != nil {
		t.Fatal(err)
	}
	rt.Kick()
	again := drain(t, b, "orders", "reader", 2)
	if e0, e1 := strings.Split(first[0].msg.TxID, ":")[1], strings.Split(again[0].msg.TxID, ":")[1]; again[0].ev.Op != "r" || e0 == e1 {
		t.Fatalf("after resync: %s (epochs %s, %s)", again[0].msg.Data, e0, e1)
	}
	waitStatus(connector.PhaseStreaming)

	if _, err := store.Delete(ctx, "default", "orders-src", true); err != nil {
		t.Fatal(err)
	}
	rt.Kick()
	waitStatus("gone")
	if n := count(t, s, db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'queen_orders_src'"); n != 0 {
		t.Fatal("the slot survived the DELETE")
	}
	if n := count(t, s, db, "SELECT count(*) FROM pg_publication WHERE pubname = 'queen_orders_src'"); n != 0 {
		t.Fatal("the publication survived the DELETE")
	}
}
