package pgsource

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

const ordersDDL = `CREATE TABLE orders (
  id         bigint PRIMARY KEY,
  customer   jsonb NOT NULL,
  status     text NOT NULL,
  total      numeric(12,2) NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO orders (id, customer, status, total, created_at) VALUES
  (1, '{"name": "Ada", "tier": "gold"}', 'new', 42.00, '2026-10-03 06:14:39.365472+00'),
  (2, '{"name": "Linus", "tier": "silver"}', 'new', 17.50, '2026-10-03 06:14:39.365472+00');`

var idRe = regexp.MustCompile(`^pg:([0-9a-f]{8}):([0-9A-F]{16}):(\d+)$`)
var tsRe = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)

func ordersSource(t *testing.T) (*pgtest.Server, string) {
	s := pgtest.Shared(t)
	db := s.NewDatabase(t)
	s.Exec(t, db, ordersDDL)
	return s, db
}

// TestTryItWalkthrough: the connector guide's walkthrough. Two rows are
// copied by the snapshot as r events; an update, and an insert and a
// delete in one transaction, arrive as u, c and d events with the ids,
// lsn, xid and seq the change events describe, field for field.
func TestTryItWalkthrough(t *testing.T) {
	s, db := ordersSource(t)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "orders-src", connector.TableSpec{Table: "public.orders", Queue: "orders"})
	rec, metrics := newRecMetrics()
	src := startSourceEnv(t, connector.Env{Broker: b, Tenant: "default", Doc: doc, NodeID: "n1", AllowPrivateNetworks: true, Metrics: metrics}, nil)
	st := src.waitPhase(t, connector.PhaseStreaming)

	snap := drain(t, b, "orders", "reader", 2)
	for i, g := range snap {
		e := g.ev
		if e.Op != "r" || e.Table != "public.orders" || e.Xid != nil || e.Seq != i || e.Before != nil {
			t.Fatalf("snapshot event %d: %s", i, g.msg.Data)
		}
		if g.msg.Partition != fmt.Sprint(i+1) || string(e.Key["id"]) != fmt.Sprint(i+1) {
			t.Fatalf("snapshot event %d in partition %q key %s", i, g.msg.Partition, e.Key["id"])
		}
		if !tsRe.MatchString(e.TS) {
			t.Fatalf("ts %q", e.TS)
		}
		if e.LSN != snap[0].ev.LSN {
			t.Fatalf("the chunk's rows carry lsn %s and %s", snap[0].ev.LSN, e.LSN)
		}
		if _, ok := g.raw["unchanged"]; ok {
			t.Fatalf("unchanged present: %s", g.msg.Data)
		}
	}
	wantAfter := []string{
		`{"id":1,"customer":{"name": "Ada", "tier": "gold"},"status":"new","total":42.00,"created_at":"2026-10-03T06:14:39.365472+00:00"}`,
		`{"id":2,"customer":{"name": "Linus", "tier": "silver"},"status":"new","total":17.50,"created_at":"2026-10-03T06:14:39.365472+00:00"}`,
	}
	for i, g := range snap {
		if got := string(g.raw["after"]); got != wantAfter[i] {
			t.Fatalf("after %d = %s, want %s", i, got, wantAfter[i])
		}
	}
	// The status shows the pointer at the snapshot's position.
	if err := waitFor(func() error {
		if p := src.status.Get().PointerLSN; p != snap[0].ev.LSN {
			return fmt.Errorf("pointerLsn %s, want %s", p, snap[0].ev.LSN)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_ = st

	s.Exec(t, db, `UPDATE orders SET status = 'paid' WHERE id = 1`)
	s.Exec(t, db, `BEGIN;
INSERT INTO orders (id, customer, status, total) VALUES (3, '{"name": "Grace", "tier": "gold"}', 'new', 99.90);
DELETE FROM orders WHERE id = 2;
COMMIT;`)
	ch := drain(t, b, "orders", "reader", 3)
	byPart := map[string]got{}
	for _, g := range ch {
		byPart[g.msg.Partition] = g
	}
	u, d, c := byPart["1"], byPart["2"], byPart["3"]
	if u.ev.Op != "u" || d.ev.Op != "d" || c.ev.Op != "c" {
		t.Fatalf("ops %s %s %s", u.msg.Data, d.msg.Data, c.msg.Data)
	}
	if string(u.raw["after"]) != `{"id":1,"customer":{"name": "Ada", "tier": "gold"},"status":"paid","total":42.00,"created_at":"2026-10-03T06:14:39.365472+00:00"}` ||
		string(u.raw["before"]) != "null" || u.ev.Seq != 0 {
		t.Fatalf("update event %s", u.msg.Data)
	}
	if string(d.raw["after"]) != "null" || string(d.raw["before"]) != `{"id":2}` || string(d.raw["key"]) != `{"id":2}` || d.ev.Seq != 1 {
		t.Fatalf("delete event %s", d.msg.Data)
	}
	if c.ev.Seq != 0 || string(c.raw["before"]) != "null" || string(c.ev.After["total"]) != "99.90" {
		t.Fatalf("insert event %s", c.msg.Data)
	}
	if c.ev.LSN != d.ev.LSN || *c.ev.Xid != *d.ev.Xid || c.ev.TS != d.ev.TS || c.ev.LSN == u.ev.LSN || *u.ev.Xid == *c.ev.Xid {
		t.Fatalf("one transaction's events must share lsn, xid and ts: %s / %s / %s", u.msg.Data, c.msg.Data, d.msg.Data)
	}
	for _, g := range []got{u, c, d} {
		m := idRe.FindStringSubmatch(g.msg.TxID)
		if m == nil {
			t.Fatalf("transactionId %q", g.msg.TxID)
		}
		lsn, err := pglogrepl.ParseLSN(g.ev.LSN)
		if err != nil {
			t.Fatal(err)
		}
		if m[2] != fmt.Sprintf("%016X", uint64(lsn)) || m[3] != fmt.Sprint(g.ev.Seq) {
			t.Fatalf("transactionId %s does not match lsn %s seq %d", g.msg.TxID, g.ev.LSN, g.ev.Seq)
		}
		if !tsRe.MatchString(g.ev.TS) {
			t.Fatalf("ts %q", g.ev.TS)
		}
	}
	// The snapshot's ids use the same epoch.
	if m := idRe.FindStringSubmatch(u.msg.TxID); m == nil || !regexp.MustCompile(`^pg:`+m[1]+`:s:[0-9A-F]{16}:0$`).MatchString(snap[0].msg.TxID) {
		t.Fatalf("snapshot id %s, change id %s", snap[0].msg.TxID, u.msg.TxID)
	}
	if got := src.status.Get().Messages; got != 5 {
		t.Fatalf("status messages = %d, want 5", got)
	}
	// The metrics: 2 transactions, 5 messages, 2 snapshot rows, the owner,
	// and the pointer at the last commit's end.
	if err := waitFor(func() error {
		if rec.get("transactions") != 2 || rec.get("messages") != 5 || rec.get("snapshot_rows") != 2 || rec.get("owner") != 1 || rec.get("bundles") < 3 {
			return fmt.Errorf("metrics %v", rec)
		}
		if l, _ := pglogrepl.ParseLSN(c.ev.LSN); rec.get("pointer_lsn") <= float64(l) {
			return fmt.Errorf("pointer_lsn %v not past the last commit %s", rec.get("pointer_lsn"), c.ev.LSN)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func waitFor(f func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var _ = context.Background
