package pgsource

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
)

// TestWindowFailsWhole: a chunk's read that fails inside the pipeline (the
// table is gone) returns that error, naming the table, instead of hanging
// on the statements PostgreSQL skipped after it or taking the high
// watermark's answer for the chunk's.
func TestWindowFailsWhole(t *testing.T) {
	s := pgtest.Shared(t)
	db := s.NewDatabase(t)
	s.Exec(t, db, "CREATE TABLE w (id int PRIMARY KEY, v text)")
	s.Exec(t, db, "INSERT INTO w SELECT g, 'x' FROM generate_series(1, 10) g")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, ti, rel := queryTable(ctx, t, s, db, "w")
	sn := &snapshotter{r: &run{s: &Source{}, q: q}, prefix: "queen:test:wm", run: "r"}
	w := &chunkWork{id: "r:1", table: ti, rel: rel, limit: 4}
	if _, err := sn.readWindow(ctx, w, []string{"4"}); err != nil {
		t.Fatal(err)
	}
	if got := w.chunk.rows(); got != 4 || string(w.chunk.vals[0]) != "5" {
		t.Fatalf("the chunk after key 4 holds %d rows from %q, want 4 from 5", got, w.chunk.vals[0])
	}
	s.Exec(t, db, "DROP TABLE w")
	w = &chunkWork{id: "r:2", table: ti, rel: rel, limit: 4}
	_, err := sn.readWindow(ctx, w, nil)
	t.Logf("the error: %v", err)
	if err == nil || !strings.Contains(err.Error(), "read a snapshot chunk of public.w") {
		t.Fatalf("reading a dropped table's chunk: %v, want the chunk read's error", err)
	}
}
