package pgconn

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestSinkDeleteKeepsProgress: DELETE of a sink answers 200 and the sink
// is gone, but its consumer group and its progress rows stay. Re-created
// with the same name, it resumes from the group: the messages pushed
// meanwhile are written, none of the earlier ones is delivered again
// (queen_pg_sink_skipped_total stays 0) and none is written twice.
func TestSinkDeleteKeepsProgress(t *testing.T) {
	pg := pgtest.Shared(t)
	db := pg.NewDatabase(t)
	url := pg.URL(db)
	pg.Exec(t, db, `CREATE TABLE nums (n int NOT NULL)`)
	n := startNodes(t, 1)[0]
	push := func(from, to int) {
		var items []M
		for i := from; i < to; i++ {
			items = append(items, M{"queue": "nums", "partition": fmt.Sprintf("p%d", i%8), "transactionId": fmt.Sprintf("m-%d", i), "payload": M{"n": i}})
		}
		mustCall(t, "POST", n.base()+"/api/v1/push", M{"items": items}, 201)
	}
	rows := func(want int) {
		t.Helper()
		if err := testkit.CheckFor(60*time.Second, 50*time.Millisecond, func() error {
			if c := queryInt(t, url, `SELECT count(*) FROM nums`); c != want {
				return fmt.Errorf("%d rows, want %d", c, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	doc := M{"kind": "sink", "connection": connection(pg, db), "sink": M{"queue": "nums", "table": "public.nums", "mode": "append", "batch": 100}}
	push(0, 1000)
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/nums", doc, 200)
	rows(1000)
	progress := queryInt(t, url, `SELECT count(*) FROM queen.sink_progress`)
	if progress != 8 {
		t.Fatalf("%d progress rows for 8 partitions", progress)
	}

	mustCall(t, "DELETE", n.base()+"/api/v1/connectors/nums", nil, 200)
	mustCall(t, "GET", n.base()+"/api/v1/connectors/nums", nil, 404)
	group := mustCall(t, "GET", n.base()+"/api/v1/consumer-groups/pg-nums", nil, 200)
	if m := regexp.MustCompile(`"consumed":(\d+)`).FindSubmatch(group); m == nil || string(m[1]) != "1000" {
		t.Fatalf("the group after the delete: %s", group)
	}
	if c := queryInt(t, url, `SELECT count(*) FROM queen.sink_progress WHERE last_offset >= 0`); c != progress {
		t.Fatalf("%d progress rows after the delete, had %d", c, progress)
	}
	// Deleted means stopped: what is pushed now stays in the queue.
	push(1000, 1500)
	time.Sleep(2 * time.Second) // four reloads of the documents
	if c := queryInt(t, url, `SELECT count(*) FROM nums`); c != 1000 {
		t.Fatalf("%d rows while the sink is deleted", c)
	}

	mustCall(t, "PUT", n.base()+"/api/v1/connectors/nums", doc, 200)
	rows(1500)
	if d := queryInt(t, url, `SELECT count(DISTINCT n) FROM nums`); d != 1500 {
		t.Fatalf("%d distinct messages in 1500 rows", d)
	}
	if s := metric(t, n, "queen_pg_sink_skipped_total"); s != 0 {
		t.Fatalf("queen_pg_sink_skipped_total %v: the re-created sink was handed messages it had written", s)
	}
	if a := metric(t, n, "queen_pg_sink_applied_total"); a != 500 && a != 1500 {
		t.Fatalf("queen_pg_sink_applied_total %v", a)
	}
}

// metric is the sum of a metric's series on p's /metrics/prometheus.
func metric(t testing.TB, p *proc, name string) float64 {
	t.Helper()
	b := mustCall(t, "GET", p.base()+"/metrics/prometheus", nil, 200)
	re := regexp.MustCompile(`(?m)^` + name + `(?:\{[^}]*\})? (\S+)$`)
	var sum float64
	for _, m := range re.FindAllSubmatch(b, -1) {
		v, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatalf("%s: %s", name, m[0])
		}
		sum += v
	}
	return sum
}
