package pgconn

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/pgtest"
)

// TestTableToCopyUnderKill9: a table → source → queue → cdc sink → copy
// table, in one broker process that is killed with kill -9 three times
// while a writer inserts, updates, deletes and changes keys of the
// table. At the end the copy holds exactly the table's rows, and nothing
// was dead-lettered.
func TestTableToCopyUnderKill9(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	pg := pgtest.Shared(t)
	db := pg.NewDatabase(t)
	url := pg.URL(db)
	pg.Exec(t, db, `CREATE TABLE src (id int PRIMARY KEY, v int NOT NULL, note text, amount numeric(12,2), tags jsonb);
INSERT INTO src SELECT g, 0, 'row ' || g, g * 1.25, jsonb_build_object('g', g) FROM generate_series(1, 2000) g;
CREATE TABLE dst (LIKE src INCLUDING ALL);`)
	n := startNodes(t, 1)[0]
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/e2e-src", sourceDoc(pg, db, []M{{"table": "public.src", "queue": "changes"}},
		M{"snapshotChunkRows": 500, "maxBundleMessages": 200, "lingerMs": 5}), 200)
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/dst", M{"kind": "sink", "connection": connection(pg, db),
		"sink": M{"queue": "changes", "table": "public.dst", "mode": "cdc", "batch": 200, "workers": 2, "leaseSeconds": 5}}, 200)
	waitPhase(t, n, "e2e-src", "streaming", 60*time.Second)

	stop, done := make(chan struct{}), make(chan error, 1)
	var stats writeStats
	wrng := rand.New(rand.NewSource(rng.Int63()))
	go func() { done <- writeMixed(url, wrng, stop, &stats) }()
	for k := 0; k < 3; k++ {
		time.Sleep(time.Duration(500+rng.Intn(1500)) * time.Millisecond)
		n.kill()
		t.Logf("kill %d: kill -9 of the broker", k)
		n.restart(t)
	}
	time.Sleep(time.Duration(300+rng.Intn(700)) * time.Millisecond)
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("the writer made %+v", stats)
	if stats.KeyChanges == 0 || stats.Deletes == 0 || stats.Inserts == 0 {
		t.Fatalf("the load lacks a kind of change: %+v", stats)
	}
	waitSameRows(t, url, "src", "dst", "id", 2*time.Minute)
	var dlq struct {
		Total int `json:"total"`
	}
	if err := json.Unmarshal(mustCall(t, "GET", n.base()+"/api/v1/dlq?queue=changes&consumerGroup=pg-dst", nil, 200), &dlq); err != nil || dlq.Total != 0 {
		t.Fatalf("%d dead letters (%v)", dlq.Total, err)
	}
	t.Logf("the copy equals the table: %d rows", queryInt(t, url, `SELECT count(*) FROM dst`))
}

type writeStats struct{ Txns, Inserts, Updates, Deletes, KeyChanges int }

// writeMixed changes src until stop: transactions of 1-8 inserts, updates
// (of v, note, amount and tags), deletes and key changes, on keys never
// reused.
func writeMixed(url string, rng *rand.Rand, stop chan struct{}, st *writeStats) error {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	live := make([]int, 0, 4000)
	for i := 1; i <= 2000; i++ {
		live = append(live, i)
	}
	next := 100000
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		for j, n := 0, 1+rng.Intn(8); j < n; j++ {
			i := rng.Intn(len(live))
			k := live[i]
			var q string
			var args []any
			switch r := rng.Intn(10); {
			case r < 3:
				next++
				q, args = `INSERT INTO src VALUES ($1, 0, $2, $3, jsonb_build_object('n', $1::int))`, []any{next, fmt.Sprint("new ", rng.Intn(1000)), fmt.Sprintf("%d.%02d", rng.Intn(1000), rng.Intn(100))}
				live = append(live, next)
				st.Inserts++
			case r < 4:
				q, args = `DELETE FROM src WHERE id = $1`, []any{k}
				live = append(live[:i], live[i+1:]...)
				st.Deletes++
			case r < 5:
				next++
				q, args = `UPDATE src SET id = $2, v = v + 1 WHERE id = $1`, []any{k, next}
				live[i] = next
				st.KeyChanges++
			default:
				q, args = `UPDATE src SET v = v + 1, note = $2, amount = amount + 1, tags = tags || jsonb_build_object('u', v + 1) WHERE id = $1`, []any{k, fmt.Sprint("upd ", rng.Intn(1000))}
				st.Updates++
			}
			if _, err := tx.Exec(ctx, q, args...); err != nil {
				return fmt.Errorf("%s %v: %w", q, args, err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		st.Txns++
		time.Sleep(time.Duration(rng.Intn(10)) * time.Millisecond)
	}
}
