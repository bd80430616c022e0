package e2e

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
)

// pgCount runs a count(*)-like query.
func pgCount(t *testing.T, url, q string) int { t.Helper(); return pgtest.QueryInt(t, url, q) }

// TestPgSinkKill9: a sink created over HTTP writes 100,000 messages into an
// append table while the broker process is killed with SIGKILL three times
// and started again on its data; the table ends with each message exactly
// once and nothing dead-lettered.
func TestPgSinkKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the kill -9 trial sinks 100,000 messages")
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	pg := pgtest.Private(t, pgtest.Options{})
	name := pg.NewDatabase(t)
	db := pg.URL(name)
	pg.Exec(t, name, `CREATE TABLE nums (n int NOT NULL, pad text)`)
	s := startServer(t, withEnv("QUEEN_ENCRYPTION_KEY", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"),
		withEnv("QUEEN_PG_RELOAD_MS", "500"))
	const n = 100000
	pad := strings.Repeat("x", 120)
	for i := 0; i < n; i += 1000 {
		items := make([]pushItem, 1000)
		for j := range items {
			k := i + j
			items[j] = pushItem{Queue: "nums", Partition: fmt.Sprintf("p%d", k%32), TransactionID: fmt.Sprintf("m-%d", k),
				Payload: M{"n": k, "pad": pad}}
		}
		s.push(t, items)
	}
	s.callJSON(t, "PUT", "/api/v1/connectors/nums", M{
		"kind":       "sink",
		"connection": M{"url": db},
		"sink":       M{"queue": "nums", "table": "public.nums", "mode": "append", "workers": 2, "leaseSeconds": 5},
	}, 200, nil)
	rows := func() int { return pgCount(t, db, `SELECT count(*) FROM nums`) }
	for k := 1; k <= 3; k++ {
		at := k*n/4 + rng.IntN(n/8) - n/16
		if err := checkFor(3*time.Minute, 20*time.Millisecond, func() error {
			if c := rows(); c < at {
				return fmt.Errorf("%d rows, waiting for %d", c, at)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		s.Kill()
		t.Logf("kill -9 at %d rows", rows())
		s.Restart(t)
	}
	if err := checkFor(3*time.Minute, 50*time.Millisecond, func() error {
		if c := rows(); c != n {
			return fmt.Errorf("%d rows, want %d", c, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if d := pgCount(t, db, `SELECT count(DISTINCT n) FROM nums`); d != n {
		t.Fatalf("%d distinct messages in %d rows: duplicates", d, n)
	}
	if d := s.dlq(t, "queue=nums&consumerGroup=pg-nums"); d.Total != 0 {
		t.Fatalf("%d dead letters", d.Total)
	}
	var doc struct {
		Status struct {
			Phase string `json:"phase"`
		} `json:"status"`
	}
	s.callJSON(t, "GET", "/api/v1/connectors/nums", nil, 200, &doc)
	if doc.Status.Phase != "running" {
		t.Fatalf("status %+v", doc.Status)
	}
}
