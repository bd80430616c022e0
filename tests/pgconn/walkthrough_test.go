package pgconn

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

var changeID = regexp.MustCompile(`^pg:[0-9a-f]{8}:([0-9A-F]{16}):(\d+)$`)

// TestTryItOverHTTP: the guide's walkthrough against the real binary,
// everything over HTTP: the source made with one PUT copies two rows as r
// events, an update and an insert+delete transaction arrive as u, c and d
// with their ids, and a cdc sink made with a second PUT copies the table.
// (internal/pgsource's TestTryItWalkthrough checks the events field for
// field in process; this checks the same path through the HTTP API and
// the sink behind it.)
func TestTryItOverHTTP(t *testing.T) {
	pg := pgtest.Shared(t)
	db := pg.NewDatabase(t)
	url := pg.URL(db)
	pg.Exec(t, db, `CREATE TABLE orders (
  id         bigint PRIMARY KEY,
  customer   jsonb NOT NULL,
  status     text NOT NULL,
  total      numeric(12,2) NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO orders (id, customer, status, total) VALUES
  (1, '{"name": "Ada", "tier": "gold"}', 'new', 42.00),
  (2, '{"name": "Linus", "tier": "silver"}', 'new', 17.50);`)
	n := startNodes(t, 1)[0]
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/orders-src",
		sourceDoc(pg, db, []M{{"table": "public.orders", "queue": "orders"}}, nil), 200)
	v := waitPhase(t, n, "orders-src", "streaming", 60*time.Second)
	if v.State == nil || v.State.Lease == nil || v.State.Lease.Node != n.id || len(v.State.Pointer) == 0 {
		t.Fatalf("state of a streaming source: %+v", v.State)
	}

	snap := popN(t, n, "orders", "reader", 2)
	for i, m := range snap {
		e := m.ev
		if e.Op != "r" || e.Table != "public.orders" || m.Partition != fmt.Sprint(i+1) || string(e.Key["id"]) != fmt.Sprint(i+1) ||
			e.Xid != nil || e.Before != nil || e.Seq != i || e.LSN != snap[0].ev.LSN {
			t.Fatalf("snapshot event %d: %s %s", i, m.Partition, m.Data)
		}
	}
	if got := string(snap[0].ev.After["customer"]); got != `{"name": "Ada", "tier": "gold"}` || string(snap[0].ev.After["total"]) != "42.00" {
		t.Fatalf("after of row 1: %s", snap[0].Data)
	}

	pg.Exec(t, db, `UPDATE orders SET status = 'paid' WHERE id = 1`)
	pg.Exec(t, db, `BEGIN;
INSERT INTO orders (id, customer, status, total) VALUES (3, '{"name": "Grace", "tier": "gold"}', 'new', 99.90);
DELETE FROM orders WHERE id = 2;
COMMIT;`)
	by := map[string]msg{}
	for _, m := range popN(t, n, "orders", "reader", 3) {
		by[m.Partition] = m
	}
	u, d, c := by["1"], by["2"], by["3"]
	if u.ev.Op != "u" || string(u.ev.After["status"]) != `"paid"` || u.ev.Before != nil || u.ev.Xid == nil {
		t.Fatalf("update: %s", u.Data)
	}
	if c.ev.Op != "c" || string(c.ev.After["total"]) != "99.90" || c.ev.Seq != 0 {
		t.Fatalf("insert: %s", c.Data)
	}
	if d.ev.Op != "d" || d.ev.After != nil || string(d.ev.Key["id"]) != "2" || string(d.ev.Before["id"]) != "2" || d.ev.Seq != 1 {
		t.Fatalf("delete: %s", d.Data)
	}
	if c.ev.LSN != d.ev.LSN || c.ev.Xid == nil || d.ev.Xid == nil || *c.ev.Xid != *d.ev.Xid || c.ev.LSN == u.ev.LSN {
		t.Fatalf("one transaction's events share lsn and xid: %s / %s / %s", u.Data, c.Data, d.Data)
	}
	for _, m := range []msg{u, c, d} {
		id := changeID.FindStringSubmatch(m.TransactionID)
		if id == nil || id[1] != fmt.Sprintf("%016X", lsnOf(t, m)) || id[2] != fmt.Sprint(m.ev.Seq) {
			t.Fatalf("transactionId %q of %s", m.TransactionID, m.Data)
		}
	}

	pg.Exec(t, db, `CREATE TABLE orders_copy (LIKE orders INCLUDING ALL)`)
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/orders-copy", M{"kind": "sink", "connection": connection(pg, db),
		"sink": M{"queue": "orders", "table": "public.orders_copy", "mode": "cdc"}}, 200)
	waitSameRows(t, url, "orders", "orders_copy", "id", 60*time.Second)
	want := "1 {\"name\": \"Ada\", \"tier\": \"gold\"} paid 42.00|3 {\"name\": \"Grace\", \"tier\": \"gold\"} new 99.90"
	if got := strings.Join(rowsText(t, url, `SELECT concat_ws(' ', id, customer, status, total) FROM orders_copy ORDER BY id`), "|"); got != want {
		t.Fatalf("orders_copy:\n%s\nwant\n%s", got, want)
	}
}

// popN pops until n messages came (and fails on more).
func popN(t testing.TB, p *proc, queue, group string, n int) []msg {
	t.Helper()
	var out []msg
	err := testkit.CheckFor(30*time.Second, 10*time.Millisecond, func() error {
		ms, err := pop(p, queue, group)
		if err != nil {
			return err
		}
		out = append(out, ms...)
		if len(out) < n {
			return fmt.Errorf("%d of %d messages", len(out), n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != n {
		t.Fatalf("%d messages, want %d", len(out), n)
	}
	return out
}

// waitSameRows waits until table b holds exactly the rows of table a
// (every column, compared as text, ordered by key), and fails with the
// difference when it does not within the time.
func waitSameRows(t testing.TB, url, a, b, key string, within time.Duration) {
	t.Helper()
	q := func(tbl string) string {
		return fmt.Sprintf(`SELECT x::text FROM %s x ORDER BY %s`, tbl, key)
	}
	var ra, rb []string
	err := testkit.CheckFor(within, 100*time.Millisecond, func() error {
		ra, rb = rowsText(t, url, q(a)), rowsText(t, url, q(b))
		if strings.Join(ra, "\n") != strings.Join(rb, "\n") {
			return fmt.Errorf("%s has %d rows, %s %d", a, len(ra), b, len(rb))
		}
		return nil
	})
	if err != nil {
		diff := rowsText(t, url, fmt.Sprintf(`(SELECT 'only in %[1]s: ' || x::text FROM (TABLE %[1]s EXCEPT TABLE %[2]s) x)
			UNION ALL (SELECT 'only in %[2]s: ' || x::text FROM (TABLE %[2]s EXCEPT TABLE %[1]s) x) LIMIT 20`, a, b))
		t.Fatalf("%v:\n%s", err, strings.Join(diff, "\n"))
	}
}
