package pgsink

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/pgtest"
)

func crashPG(t *testing.T, url string) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	pp, _ := strconv.Atoi(f[1])
	c.Close(ctx)
	syscall.Kill(pp, syscall.SIGQUIT)
	for syscall.Kill(pp, 0) == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

func TestZZExperiment(t *testing.T) {
	pg := pgtest.Private(t, pgtest.Options{Settings: map[string]string{"synchronous_commit": "on", "wal_writer_delay": "10000ms", "bgwriter_lru_maxpages": "0"}})
	db := pg.URL(pg.NewDatabase(t))
	exec(t, db, "CREATE TABLE t (n int)", "CREATE TABLE b (k int primary key, v int)", "INSERT INTO b VALUES (1, 0)", "CHECKPOINT")
	for _, barrier := range []string{"", "BEGIN; SELECT pg_current_xact_id(); COMMIT", "BEGIN; UPDATE b SET v = v + 1 WHERE k = 1; COMMIT", "SELECT 1"} {
		ctx := context.Background()
		c, err := pgx.Connect(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "BEGIN; SET LOCAL synchronous_commit = off; INSERT INTO t VALUES (1); COMMIT"); err != nil {
			t.Fatal(err)
		}
		if barrier != "" {
			if _, err := c.Exec(ctx, barrier); err != nil {
				t.Fatal(err)
			}
		}
		c.Close(ctx)
		crashPG(t, db)
		pg.Start(t)
		t.Logf("barrier %q: rows %v", barrier, query(t, db, "SELECT count(*) FROM t"))
		exec(t, db, "TRUNCATE t", "CHECKPOINT")
	}
}
