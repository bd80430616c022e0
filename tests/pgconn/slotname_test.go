package pgconn

import (
	"fmt"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestSameNameOtherDatabase: two brokers (say staging and production)
// each run a source named "orders" against two databases of one
// PostgreSQL cluster. Replication slots are per cluster, so both derive
// the slot queen_orders. The first source must keep its slot and go on
// streaming every change of its database once; the second must not take
// or drop a slot of another database.
func TestSameNameOtherDatabase(t *testing.T) {
	pg := pgtest.Shared(t)
	db1, db2 := pg.NewDatabase(t), pg.NewDatabase(t)
	for _, db := range []string{db1, db2} {
		pg.Exec(t, db, `CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t VALUES (1, 0)`)
	}
	a, b := startNodes(t, 1)[0], startNodes(t, 1)[0]
	doc := func(db string) M { return sourceDoc(pg, db, []M{{"table": "public.t", "queue": "t"}}, nil) }
	mustCall(t, "PUT", a.base()+"/api/v1/connectors/orders", doc(db1), 200)
	waitPhase(t, a, "orders", "streaming", 60*time.Second)
	if ms := popN(t, a, "t", "check", 1); ms[0].ev.Op != "r" {
		t.Fatalf("first event %s", ms[0].Data)
	}
	// While the first broker is down (its slot inactive), the second
	// source starts, and the first database changes.
	a.kill()
	mustCall(t, "PUT", b.base()+"/api/v1/connectors/orders", doc(db2), 200)
	for i := 1; i <= 20; i++ {
		pg.Exec(t, db1, fmt.Sprintf(`UPDATE t SET v = %d WHERE id = 1`, i))
		time.Sleep(100 * time.Millisecond)
	}
	// The second source names the conflict instead of taking the slot.
	if err := testkit.CheckFor(20*time.Second, 50*time.Millisecond, func() error {
		vb, ok := connector(b, "orders")
		if !ok {
			return fmt.Errorf("the second broker does not list the source")
		}
		if vb.Status.Phase != "error" || vb.Status.Code != "slot_in_use" {
			return fmt.Errorf("the second source is %s %s %s, want error slot_in_use", vb.Status.Phase, vb.Status.Code, vb.Status.Message)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a.restart(t)
	pg.Exec(t, db1, `INSERT INTO t VALUES (2, 0)`)
	var got []msg
	err := testkit.CheckFor(20*time.Second, 10*time.Millisecond, func() error {
		ms, err := pop(a, "t", "check")
		if err != nil {
			return err
		}
		got = append(got, ms...)
		if len(got) < 21 {
			v, _ := connector(a, "orders")
			return fmt.Errorf("%d of 21 changes; the first source is %s %s %s", len(got), v.Status.Phase, v.Status.Code, v.Status.Message)
		}
		return nil
	})
	if err != nil {
		vb, _ := connector(b, "orders")
		slots := rowsText(t, pg.URL("postgres"), `SELECT slot_name || ' in ' || database || ' active ' || active FROM pg_replication_slots WHERE slot_name = 'queen_orders'`)
		t.Fatalf("%v (the second source: %s %s %s); slots %v (the first source's database is %s): the second source dropped the first one's slot", err, vb.Status.Phase, vb.Status.Code, vb.Status.Message, slots, db1)
	}
	// Order holds per key (per partition), not across the two keys.
	var ups []msg
	inserts := 0
	for _, m := range got {
		switch m.ev.Op {
		case "u":
			ups = append(ups, m)
		case "c":
			inserts++
		default:
			t.Fatalf("change %s", m.Data)
		}
	}
	if len(ups) != 20 || inserts != 1 {
		t.Fatalf("%d updates and %d inserts, want 20 and 1", len(ups), inserts)
	}
	for i, m := range ups {
		if string(m.ev.After["v"]) != fmt.Sprint(i+1) {
			t.Fatalf("update %d: %s", i, m.Data)
		}
	}
}
