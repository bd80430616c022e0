package pgconn

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestLargeTransactionKill9: one 200,000-row transaction (QUEEN_SOURCE_ROWS;
// 20,000 under -short) goes into the queue in pieces; the broker is killed
// with kill -9 when the queue holds about half of it and started again. The
// queue then holds one message per row, compared with the table: each key
// once with the row's value, the ids of the transaction's changes 0..n-1
// each once, nothing else.
func TestLargeTransactionKill9(t *testing.T) {
	rows := 200000
	if testing.Short() {
		rows = 20000
	}
	if n, err := strconv.Atoi(os.Getenv("QUEEN_SOURCE_ROWS")); err == nil && n > 0 {
		rows = n
	}
	pg := pgtest.Shared(t)
	db := pg.NewDatabase(t)
	url := pg.URL(db)
	pg.Exec(t, db, "CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL)")
	n := startNodes(t, 1)[0]
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/big", sourceDoc(pg, db, []M{{"table": "public.big", "queue": "big"}},
		M{"snapshot": "never"}), 200)
	waitPhase(t, n, "big", "streaming", 60*time.Second)
	start := time.Now()
	pg.Exec(t, db, fmt.Sprintf("INSERT INTO big SELECT g, md5(g::text) || repeat('v', 120) FROM generate_series(1, %d) g", rows))

	held := func() int {
		code, b, err := call("GET", n.base()+"/api/v1/resources/queues/big?limit=1", nil)
		var q struct {
			Messages struct {
				Total int `json:"total"`
			} `json:"messages"`
		}
		if err != nil || code != 200 || json.Unmarshal(b, &q) != nil {
			return -1
		}
		return q.Messages.Total
	}
	var atKill int
	if err := testkit.CheckFor(5*time.Minute, 5*time.Millisecond, func() error {
		if atKill = held(); atKill < rows/2 {
			return fmt.Errorf("the queue holds %d of %d", atKill, rows)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	n.kill()
	t.Logf("kill -9 when the queue held %d of %d messages (%v after the commit)", atKill, rows, time.Since(start).Round(time.Millisecond))
	n.restart(t)
	if h := held(); h >= rows {
		t.Fatalf("the queue holds %d of %d right after the restart: the kill came too late to test anything", h, rows)
	} else {
		t.Logf("after the restart the queue holds %d", h)
	}

	want := map[string]string{}
	for _, r := range rowsText(t, url, `SELECT id || ' ' || v FROM big`) {
		k, v, _ := strings.Cut(r, " ")
		want[k] = v
	}
	if len(want) != rows {
		t.Fatalf("the table holds %d rows", len(want))
	}
	seen := make(map[string]bool, rows)
	ids := make(map[string]bool, rows)
	prefix := ""
	// The source pushes a piece at least every few seconds; a minute
	// without a message means the rest is not coming.
	progress := time.Now()
	for len(seen) < rows {
		if time.Since(progress) > time.Minute {
			t.Fatalf("%d of %d rows, and none for a minute", len(seen), rows)
		}
		ms, err := pop(n, "big", "check")
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) > 0 {
			progress = time.Now()
		}
		for _, m := range ms {
			k := string(m.ev.Key["id"])
			if m.ev.Op != "c" || m.Partition != k {
				t.Fatalf("message %s in partition %s: %s", m.TransactionID, m.Partition, m.Data)
			}
			if seen[k] || ids[m.TransactionID] {
				t.Fatalf("row %s (message %s) twice", k, m.TransactionID)
			}
			seen[k], ids[m.TransactionID] = true, true
			v, ok := want[k]
			if !ok || string(m.ev.After["v"]) != strconv.Quote(v) {
				t.Fatalf("message %s: %s; the table holds %q", m.TransactionID, m.Data, v)
			}
			p := m.TransactionID[:strings.LastIndexByte(m.TransactionID, ':')]
			if prefix == "" {
				prefix = p
			} else if p != prefix {
				t.Fatalf("message %s of another transaction than %s", m.TransactionID, prefix)
			}
		}
	}
	if ms, err := pop(n, "big", "check"); err != nil || len(ms) != 0 {
		t.Fatalf("%d messages beyond the %d rows (%v)", len(ms), rows, err)
	}
	for i := 0; i < rows; i++ {
		if !ids[fmt.Sprintf("%s:%d", prefix, i)] {
			t.Fatalf("no message for the transaction's change %d", i)
		}
	}
	t.Logf("%d rows, each once, %v after the commit", rows, time.Since(start).Round(time.Millisecond))
}
