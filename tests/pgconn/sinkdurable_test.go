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

// TestSinkKilledAfterBarrier: the broker process is killed (kill -9 at
// the failpoint sink-durable) after a barrier made its batches durable in
// PostgreSQL and before their ack. Started again without the failpoint,
// the sink is handed those batches again and skips them all: the rows in
// the table at the kill are exactly the messages skipped after it, so
// every one of them was durable and none was acked yet. At the end each
// message is in the table once and the group has consumed them all.
func TestSinkKilledAfterBarrier(t *testing.T) {
	const total = 2000
	pg := pgtest.Shared(t)
	db := pg.NewDatabase(t)
	url := pg.URL(db)
	pg.Exec(t, db, `CREATE TABLE nums (n int NOT NULL)`)
	n := startNodes(t, 1, "QUEEN_FAILPOINTS=sink-durable=kill")[0]
	var items []M
	for i := 0; i < total; i++ {
		items = append(items, M{"queue": "nums", "partition": fmt.Sprintf("p%d", i%16), "payload": M{"n": i}})
	}
	mustCall(t, "POST", n.base()+"/api/v1/push", M{"items": items}, 201)
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/nums", M{"kind": "sink", "connection": connection(pg, db),
		"sink": M{"queue": "nums", "table": "public.nums", "mode": "append", "batch": 50, "leaseSeconds": 5}}, 200)
	if err := testkit.CheckFor(60*time.Second, 10*time.Millisecond, func() error {
		if n.alive() {
			return fmt.Errorf("still running")
		}
		return nil
	}); err != nil {
		t.Fatalf("the process did not reach the failpoint: %v", err)
	}
	if !strings.Contains(n.logTail(), "failpoint sink-durable: kill") {
		t.Fatalf("the process died, but not at the failpoint:\n%s", n.logTail())
	}
	atKill := queryInt(t, url, `SELECT count(*) FROM nums`)
	if atKill == 0 || atKill == total {
		t.Fatalf("%d rows at the kill: want the batches of one barrier", atKill)
	}
	t.Logf("killed after a barrier with %d rows in the table", atKill)

	n.env = nil
	n.restart(t)
	if err := testkit.CheckFor(90*time.Second, 50*time.Millisecond, func() error {
		group := mustCall(t, "GET", n.base()+"/api/v1/consumer-groups/pg-nums", nil, 200)
		if m := regexp.MustCompile(`"consumed":(\d+)`).FindSubmatch(group); m == nil || string(m[1]) != fmt.Sprint(total) {
			return fmt.Errorf("the group: %s", group)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := rowsText(t, url, `SELECT count(*) || ' ' || count(DISTINCT n) FROM nums`); got[0] != fmt.Sprintf("%d %d", total, total) {
		t.Fatalf("rows, distinct: %s, want %d each", got[0], total)
	}
	if s := metric(t, n, "queen_pg_sink_skipped_total"); s != float64(atKill) {
		t.Fatalf("queen_pg_sink_skipped_total %v after the restart, want the %d rows written before the kill: each was acked before the kill or written twice", s, atKill)
	}
}
