package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/pgtest"
)

// sourceStatus reads a connector's status through the API.
func (s *server) sourceStatus(t *testing.T, name string) (phase string, messages int, body string) {
	t.Helper()
	r, err := s.roundTrip("GET", "/api/v1/connectors/"+name, nil)
	if err != nil || r.Status != http.StatusOK {
		return "", 0, fmt.Sprint(err, r)
	}
	var v struct {
		Status struct {
			Phase    string `json:"phase"`
			Messages int    `json:"messages"`
		} `json:"status"`
	}
	_ = json.Unmarshal(r.Body, &v)
	return v.Status.Phase, v.Status.Messages, string(r.Body)
}

// TestSourceKill9InLargeTransaction: a source pushes a 200,000-row
// transaction in pieces; the broker is killed (SIGKILL) about halfway and
// started again, and the queue ends up with every row exactly once.
func TestSourceKill9InLargeTransaction(t *testing.T) {
	rows := 200000
	if testing.Short() {
		rows = 20000
	}
	if n, err := strconv.Atoi(os.Getenv("QUEEN_SOURCE_ROWS")); err == nil && n > 0 {
		rows = n
	}
	pg := pgtest.Private(t, pgtest.Options{})
	pg.Exec(t, "postgres", "CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL)")
	srv := startServer(t, withEnv("QUEEN_ENCRYPTION_KEY", strings.Repeat("cd", 32)), withEnv("QUEEN_PG_RELOAD_MS", "500"))
	doc := M{
		"kind":       "source",
		"connection": M{"url": pg.URL("postgres")},
		"source":     M{"tables": []M{{"table": "public.big", "queue": "big"}}, "snapshot": "never"},
	}
	srv.callJSON(t, "PUT", "/api/v1/connectors/big-src", doc, 200, nil)
	if err := checkFor(60*time.Second, 50*time.Millisecond, func() error {
		if phase, _, body := srv.sourceStatus(t, "big-src"); phase != "streaming" {
			return fmt.Errorf("phase %q: %s", phase, body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pg.Exec(t, "postgres", fmt.Sprintf("INSERT INTO big SELECT g, repeat('v', 150) FROM generate_series(1, %d) g", rows))
	if err := checkFor(5*time.Minute, 10*time.Millisecond, func() error {
		if _, n, _ := srv.sourceStatus(t, "big-src"); n < rows*2/5 {
			return fmt.Errorf("%d messages", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, before, _ := srv.sourceStatus(t, "big-src")
	srv.Kill()
	t.Logf("killed the broker after %d of %d messages", before, rows)
	srv.Restart(t)

	seen := make(map[string]bool, rows)
	deadline := time.Now().Add(5 * time.Minute)
	for len(seen) < rows {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows after 5 minutes", len(seen), rows)
		}
		p, _, err := srv.tryPop(popPath("big", "batch=10000&partitions=10000&consumerGroup=check&subscriptionMode=all&autoAck=true&wait=true&timeout=1000"))
		if err != nil {
			t.Fatal(err)
		}
		if p == nil {
			continue
		}
		for _, m := range p.Messages {
			if seen[m.TransactionID] {
				t.Fatalf("message %s twice", m.TransactionID)
			}
			seen[m.TransactionID] = true
		}
	}
	if p, _, err := srv.tryPop(popPath("big", "batch=10000&partitions=10000&consumerGroup=check&autoAck=true&wait=true&timeout=1000")); err != nil || p != nil {
		t.Fatalf("more than %d messages (%v)", rows, err)
	}
	for i := 0; i < rows; i++ {
		if !seen[fmt.Sprintf("%s:%d", idPrefix(seen), i)] {
			t.Fatalf("no message for the transaction's change %d", i)
		}
	}
}

// idPrefix is "pg:<epoch>:<commit LSN>" of any id in ids (one
// transaction's ids share it).
func idPrefix(ids map[string]bool) string {
	for id := range ids {
		return id[:strings.LastIndexByte(id, ':')]
	}
	return ""
}

// TestSourceKill9Trials: the broker is killed (SIGKILL) at random moments
// while its source copies a table and streams a writer's updates, inserts
// and deletes, and started again each time. In every trial the queue ends
// with each change once, in commit order per row, and each original row
// copied at most once and never older than an update before it.
func TestSourceKill9Trials(t *testing.T) {
	for trial := 0; trial < trials(); trial++ {
		seed := time.Now().UnixNano()
		t.Run(fmt.Sprint("trial", trial), func(t *testing.T) {
			t.Logf("seed %d", seed)
			sourceKillTrial(t, rand.New(rand.NewSource(seed)))
		})
	}
}

func sourceKillTrial(t *testing.T, rng *rand.Rand) {
	const rows = 20000
	pg := pgtest.Private(t, pgtest.Options{})
	pg.Exec(t, "postgres", fmt.Sprintf("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT g, 0 FROM generate_series(1, %d) g", rows))
	srv := startServer(t, withEnv("QUEEN_ENCRYPTION_KEY", strings.Repeat("cd", 32)), withEnv("QUEEN_PG_RELOAD_MS", "500"))
	srv.callJSON(t, "PUT", "/api/v1/connectors/kill-src", M{
		"kind":       "source",
		"connection": M{"url": pg.URL("postgres")},
		"source":     M{"tables": []M{{"table": "public.t", "queue": "t"}}, "snapshotChunkRows": 100, "maxBundleMessages": 50, "lingerMs": 5},
	}, 200, nil)
	// The writer starts once the source has begun (its slot exists).
	if err := checkFor(60*time.Second, 20*time.Millisecond, func() error {
		if phase, _, body := srv.sourceStatus(t, "kill-src"); phase != "snapshot" && phase != "streaming" {
			return fmt.Errorf("phase %q: %s", phase, body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	final := map[int]int{}
	done := make(chan error, 1)
	wrng := rand.New(rand.NewSource(rng.Int63()))
	go func() { done <- updateLoad(pg.URL("postgres"), wrng, rows, final) }()
	for k := 0; k < 3; k++ {
		time.Sleep(time.Duration(100+rng.Intn(900)) * time.Millisecond)
		phase, n, _ := srv.sourceStatus(t, "kill-src")
		t.Logf("kill %d in phase %s after %d messages of this run", k, phase, n)
		srv.Kill()
		srv.Restart(t)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pg.Exec(t, "postgres", "INSERT INTO t VALUES (999999, 0)")
	type ev struct {
		Op    string                     `json:"op"`
		After map[string]json.RawMessage `json:"after"`
	}
	byRow := map[string][]ev{}
	ids := map[string]bool{}
	deadline := time.Now().Add(3 * time.Minute)
	// Until the marker row arrived and a pop finds nothing more (one pop
	// claims at most 10,000 partitions).
	for marker, empty := false, false; !marker || !empty; {
		if time.Now().After(deadline) {
			t.Fatal("no marker row after 3 minutes")
		}
		p, _, err := srv.tryPop(popPath("t", "batch=10000&partitions=10000&consumerGroup=check&subscriptionMode=all&autoAck=true&wait=true&timeout=1000"))
		if err != nil {
			t.Fatal(err)
		}
		empty = p == nil
		if p == nil {
			continue
		}
		for _, m := range p.Messages {
			if ids[m.TransactionID] {
				t.Fatalf("message %s twice", m.TransactionID)
			}
			ids[m.TransactionID] = true
			var e ev
			if err := json.Unmarshal(m.Data, &e); err != nil {
				t.Fatal(err)
			}
			byRow[m.Partition] = append(byRow[m.Partition], e)
			marker = marker || m.Partition == "999999"
		}
	}
	for k := 1; k <= rows; k++ {
		snaps, lastU, lastV := 0, 0, -1
		for _, e := range byRow[strconv.Itoa(k)] {
			v, err := strconv.Atoi(string(e.After["v"]))
			if err != nil {
				t.Fatalf("row %d: %v", k, e)
			}
			switch e.Op {
			case "r":
				snaps++
				if v < lastV {
					t.Fatalf("row %d: copied v=%d after an event with v=%d", k, v, lastV)
				}
			case "u":
				if v != lastU+1 || v < lastV {
					t.Fatalf("row %d: update to v=%d after updates to %d and an event with v=%d", k, v, lastU, lastV)
				}
				lastU = v
			default:
				t.Fatalf("row %d: op %s", k, e.Op)
			}
			lastV = v
		}
		if snaps > 1 || lastU != final[k] || (final[k] == 0 && snaps != 1) {
			t.Fatalf("row %d: %d copies, updates up to %d, the writer made %d", k, snaps, lastU, final[k])
		}
	}
}

// updateLoad runs 100 transactions, each adding 1 to a few random rows.
func updateLoad(url string, rng *rand.Rand, rows int, final map[int]int) error {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	for i := 0; i < 100; i++ {
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		for j, n := 0, 1+rng.Intn(20); j < n; j++ {
			k := 1 + rng.Intn(rows)
			if _, err := tx.Exec(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", k); err != nil {
				return err
			}
			final[k]++
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		time.Sleep(time.Duration(rng.Intn(30)) * time.Millisecond)
	}
	return nil
}

// TestSourceToSinkUnderKill9: a table streams through a source into a
// queue and through a cdc sink into a copy, while a writer updates,
// inserts and deletes rows and the broker is killed (SIGKILL) twice; at
// the end the copy equals the table.
func TestSourceToSinkUnderKill9(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	pg := pgtest.Private(t, pgtest.Options{})
	pg.Exec(t, "postgres", `CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
INSERT INTO t SELECT g, 0, 'n' || g FROM generate_series(1, 2000) g;
CREATE TABLE t_copy (LIKE t INCLUDING ALL);`)
	srv := startServer(t, withEnv("QUEEN_ENCRYPTION_KEY", strings.Repeat("cd", 32)), withEnv("QUEEN_PG_RELOAD_MS", "500"))
	conn := M{"url": pg.URL("postgres")}
	srv.callJSON(t, "PUT", "/api/v1/connectors/t-src", M{"kind": "source", "connection": conn,
		"source": M{"tables": []M{{"table": "public.t", "queue": "t"}}, "maxBundleMessages": 100}}, 200, nil)
	srv.callJSON(t, "PUT", "/api/v1/connectors/t-copy", M{"kind": "sink", "connection": conn,
		"sink": M{"queue": "t", "table": "public.t_copy", "mode": "cdc"}}, 200, nil)
	done := make(chan error, 1)
	wrng := rand.New(rand.NewSource(rng.Int63()))
	go func() {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, pg.URL("postgres"))
		if err != nil {
			done <- err
			return
		}
		defer c.Close(ctx)
		next := 5000
		for i := 0; i < 200; i++ {
			var sql string
			switch k := 1 + wrng.Intn(2000); wrng.Intn(4) {
			case 0:
				next++
				sql = fmt.Sprintf("INSERT INTO t VALUES (%d, 0, 'new')", next)
			case 1:
				sql = fmt.Sprintf("DELETE FROM t WHERE id = %d", k)
			default:
				sql = fmt.Sprintf("UPDATE t SET v = v + 1, note = md5(random()::text) WHERE id BETWEEN %d AND %d", k, k+wrng.Intn(20))
			}
			if _, err := c.Exec(ctx, sql); err != nil {
				done <- err
				return
			}
			time.Sleep(time.Duration(wrng.Intn(15)) * time.Millisecond)
		}
		done <- nil
	}()
	for k := 0; k < 2; k++ {
		time.Sleep(time.Duration(300+rng.Intn(1200)) * time.Millisecond)
		srv.Kill()
		t.Logf("killed the broker (%d)", k)
		srv.Restart(t)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c := pg.Connect(t, "postgres")
	const diff = `SELECT count(*) FROM ((TABLE t EXCEPT TABLE t_copy) UNION ALL (TABLE t_copy EXCEPT TABLE t)) d`
	if err := checkFor(3*time.Minute, 200*time.Millisecond, func() error {
		var n int
		if err := c.QueryRow(context.Background(), diff).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("%d rows differ between the table and its copy", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
