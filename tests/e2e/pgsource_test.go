package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

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
