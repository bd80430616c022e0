package pgsource

import (
	"context"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/pgtest"
)

// TestBenchChunkRead measures what reading a snapshot's chunks costs on
// both sides, per 100,000 rows of make bench-source's table (QUEEN_BENCH_ROWS,
// default 200,000, in chunks of 2,000): the test process's CPU and the
// PostgreSQL backend's, for the chunk's SELECT all in text and with the
// columns the source reads in binary (chunkFormats, printed back as text),
// COPY of the same chunks in text and in binary, and one COPY of the whole table (what make bench-source compares with);
// and the wall time of a chunk's window (low watermark, read, high
// watermark) as six round trips and as the source's one pipeline. It runs
// only with QUEEN_BENCH_CHUNKS=1.
func TestBenchChunkRead(t *testing.T) {
	if os.Getenv("QUEEN_BENCH_CHUNKS") == "" {
		t.Skip("a benchmark: QUEEN_BENCH_CHUNKS=1 runs it")
	}
	rows := 200000
	if n, err := fmt.Sscan(os.Getenv("QUEEN_BENCH_ROWS"), &rows); err != nil || n != 1 {
		rows = 200000
	}
	const chunkRows = 2000
	s := pgtest.Shared(t)
	db := s.NewDatabase(t)
	s.Exec(t, db, `CREATE TABLE b (id bigint PRIMARY KEY, name text NOT NULL, n int NOT NULL, at timestamptz NOT NULL DEFAULT now())`)
	s.Exec(t, db, fmt.Sprintf(`INSERT INTO b SELECT g, repeat(md5(g::text), 5), g %% 1000, now() FROM generate_series(1, %d) g`, rows))
	s.Exec(t, db, "VACUUM ANALYZE b")
	ctx := context.Background()
	q, ti, rel := queryTable(ctx, t, s, db, "b")
	var pid int
	if err := q.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	measure := func(what string, read func() int) {
		t.Helper()
		c0, b0, w0 := selfCPU(t), procTicks(pid), time.Now()
		n := read()
		per := func(d time.Duration) time.Duration { return d * 100000 / time.Duration(n) }
		t.Logf("%-32s %d rows; per 100k rows: wall %v, test process CPU %v, backend CPU %v", what, n,
			per(time.Since(w0)).Round(time.Millisecond), per(selfCPU(t)-c0).Round(time.Millisecond),
			per(time.Duration(procTicks(pid)-b0)*10*time.Millisecond).Round(time.Millisecond))
	}
	// chunks runs read for each chunk's first key until one is short.
	chunks := func(read func(after int) int) int {
		n := 0
		for after := 0; ; after += chunkRows {
			k := read(after)
			n += k
			if k < chunkRows {
				return n
			}
		}
	}
	selectChunk := func(formats []int16) func() int {
		return func() int {
			return chunks(func(after int) int {
				rr := q.PgConn().ExecParams(ctx, chunkQuery(ti, true, chunkRows), [][]byte{fmt.Appendf(nil, "%d", after)}, nil, nil, formats)
				c := newChunk(ti, rel, chunkRows, 0, nil)
				if err := c.fill(rr); err != nil {
					t.Fatal(err)
				}
				return c.rows()
			})
		}
	}
	copyChunk := func(format string) func() int {
		return func() int {
			return chunks(func(after int) int {
				tag, err := q.PgConn().CopyTo(ctx, io.Discard, fmt.Sprintf("COPY (SELECT id, name, n, at FROM b WHERE id > %d ORDER BY id LIMIT %d) TO STDOUT (FORMAT %s)", after, chunkRows, format))
				if err != nil {
					t.Fatal(err)
				}
				return int(tag.RowsAffected())
			})
		}
	}
	for round := 0; round < 2; round++ {
		measure("SELECT chunks, text", selectChunk(nil))
		measure("SELECT chunks, binary where read", selectChunk(chunkFormats(ti)))
		measure("COPY chunks, text", copyChunk("text"))
		measure("COPY chunks, binary", copyChunk("binary"))
		measure("one COPY of the table, text", func() int {
			tag, err := q.PgConn().CopyTo(ctx, io.Discard, "COPY (SELECT * FROM b ORDER BY id) TO STDOUT")
			if err != nil {
				t.Fatal(err)
			}
			return int(tag.RowsAffected())
		})
		measure("windows, six round trips", func() int {
			return chunks(func(after int) int { return sixTrips(t, q, ti, rel, after, chunkRows) })
		})
		sn := &snapshotter{r: &run{s: &Source{}, q: q}, prefix: "queen:bench:wm", run: "bench"}
		measure("windows, one pipeline", func() int {
			return chunks(func(after int) int {
				w := &chunkWork{id: "bench:1", table: ti, rel: rel, limit: chunkRows}
				if _, err := sn.readWindow(ctx, w, []string{fmt.Sprint(after)}); err != nil {
					t.Fatal(err)
				}
				return w.chunk.rows()
			})
		})
	}
}

// sixTrips is a chunk's window as the source read it before the
// pipeline: a round trip for each statement.
func sixTrips(t *testing.T, q *pgx.Conn, ti *tableInfo, rel *relation, after, limit int) int {
	ctx := context.Background()
	if _, err := q.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, $2, true)", "queen:bench:wm", "L:bench:1"); err != nil {
		t.Fatal(err)
	}
	tx, err := q.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	var snap string
	if err := tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&snap); err != nil {
		t.Fatal(err)
	}
	ch, err := readChunk(ctx, q, ti, rel, []string{fmt.Sprint(after)}, limit, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var high string
	if err := q.QueryRow(ctx, "SELECT pg_logical_emit_message(false, $1, $2, true)::text", "queen:bench:wm", "H:bench:1").Scan(&high); err != nil {
		t.Fatal(err)
	}
	return ch.rows()
}

// selfCPU is the test process's user and system CPU so far.
func selfCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
