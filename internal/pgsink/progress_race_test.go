package pgsink

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestProgressTableCreatedConcurrently: workers (or nodes) starting at the
// same moment on a database without the progress table all get past its
// creation. Concurrent CREATE TABLE IF NOT EXISTS of one table fails in
// PostgreSQL on its catalog's unique indexes ("type ... already exists"),
// which stopped one of two sinks started together.
func TestProgressTableCreatedConcurrently(t *testing.T) {
	const rounds, workers = 10, 8
	db := newDB(t)
	ctx := context.Background()
	conns := make([]*pgx.Conn, workers)
	for i := range conns {
		c, err := pgx.Connect(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		conns[i] = c
	}
	for r := 0; r < rounds; r++ {
		table := fmt.Sprintf("progress_%d.t", r)
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for i := range conns {
			s := &sink{progress: parseIdent(table), table: parseIdent("public.target")}
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				errs[i] = s.checkProgress(ctx, conns[i])
			}(i)
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, worker %d: %v", r, i, err)
			}
		}
	}
}
