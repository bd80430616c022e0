package pgconn

import (
	"fmt"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestSinkOnPostgres16: the sink needs no particular PostgreSQL version
// (only the source needs 17): an upsert sink into a PostgreSQL 16 copies a
// queue of updates of 50 keys, each key ending at its last message, and
// records its progress there.
func TestSinkOnPostgres16(t *testing.T) {
	pg := pgtest.Private(t, pgtest.Options{Major: 16})
	url := pg.URL("postgres")
	if v := queryInt(t, url, `SELECT current_setting('server_version_num')::int / 10000`); v != 16 {
		t.Fatalf("PostgreSQL %d, want 16", v)
	}
	pg.Exec(t, "postgres", `CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)`)
	n := startNodes(t, 1)[0]
	const keys, rounds = 50, 20
	var items []M
	for r := 1; r <= rounds; r++ {
		for k := 0; k < keys; k++ {
			items = append(items, M{"queue": "acct", "partition": fmt.Sprint(k), "transactionId": fmt.Sprintf("m-%d-%d", k, r), "payload": M{"id": k, "v": r*1000 + k}})
		}
	}
	mustCall(t, "POST", n.base()+"/api/v1/push", M{"items": items}, 201)
	doc := M{"kind": "sink", "connection": connection(pg, "postgres"), "sink": M{"queue": "acct", "table": "public.acct", "mode": "upsert", "batch": 100}}
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/acct", doc, 200)
	want := 0
	for k := 0; k < keys; k++ {
		want += rounds*1000 + k
	}
	if err := testkit.CheckFor(60*time.Second, 50*time.Millisecond, func() error {
		c := queryInt(t, url, `SELECT count(*) FROM acct`)
		s := queryInt(t, url, `SELECT coalesce(sum(v), 0)::int FROM acct`)
		if c != keys || s != want {
			v, _ := connector(n, "acct")
			return fmt.Errorf("%d rows summing to %d, want %d summing to %d (sink %s %s %s)", c, s, keys, want, v.Status.Phase, v.Status.Code, v.Status.Message)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c := queryInt(t, url, `SELECT count(*) FROM acct WHERE v <> 20000 + id`); c != 0 {
		t.Fatalf("%d rows not at their key's last message", c)
	}
	if c := queryInt(t, url, `SELECT count(*) FROM queen.sink_progress`); c != keys {
		t.Fatalf("%d progress rows for %d partitions", c, keys)
	}
}
