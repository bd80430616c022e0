package pgsink

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestKnownOffsetsOneRoundTrip: once the sink has committed on a
// partition, its next batches there are written in one round trip (the
// offsets checked inside it), in append and upsert mode, and the table
// holds every message once.
func TestKnownOffsetsOneRoundTrip(t *testing.T) {
	for _, mode := range []string{"append", "upsert"} {
		t.Run(mode, func(t *testing.T) {
			db := newDB(t)
			createNums(t, db, mode)
			b := openBroker(t)
			const n, parts = 2000, 4
			pushNumbered(t, b, "nums", parts, 0, n)
			spec := sinkSpec("nums", "public.nums", mode)
			spec.Batch = 100
			r := startSink(t, b, "nums", db, spec)
			exactlyOnce(t, db, n)
			waitFor(t, "all batches acked", 30*time.Second, func() error {
				if r.metrics.applied.get() < n {
					return fmt.Errorf("applied %v", r.metrics.applied.get())
				}
				return nil
			})
			batches, one := int64(r.metrics.batches.get()), r.sink.oneTrip.Load()
			t.Logf("%d batches, %d in one round trip", batches, one)
			// Each partition's first batch reads its offset: at most one
			// careful batch per partition.
			if batches < n/100 || one < batches-parts {
				t.Fatalf("%d of %d batches in one round trip, want at least %d", one, batches, batches-parts)
			}
			if m := r.sink.moved.Load(); m != 0 {
				t.Fatalf("%d batches found their known offsets moved, with no other writer", m)
			}
		})
	}
}

// TestKnownOffsetMovedElsewhere: another writer (another node, a lease
// that ran out) applies messages of a partition and moves its progress
// row while the sink still knows the older offset. The sink's next batch
// there finds the row moved inside its transaction, writes nothing of it,
// reads the offset and skips what the other writer applied: each message
// once.
func TestKnownOffsetMovedElsewhere(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	b := openBroker(t)
	pushNumbered(t, b, "nums", 1, 0, 1000)
	spec := sinkSpec("nums", "public.nums", "append")
	spec.Batch = 100
	r := startSink(t, b, "nums", db, spec)
	exactlyOnce(t, db, 1000)
	waitFor(t, "all acked", 30*time.Second, func() error {
		if r.metrics.applied.get() < 1000 {
			return fmt.Errorf("applied %v", r.metrics.applied.get())
		}
		return nil
	})
	last := count(t, db, `SELECT last_offset FROM queen.sink_progress WHERE sink = '`+r.sink.name+`'`)
	// The other writer: messages 1000-1499 (the partition's next 500
	// offsets) in the table, the offset moved past them, in one transaction.
	exec(t, db, `BEGIN`+
		`; INSERT INTO nums SELECT g, 'other' FROM generate_series(1000, 1499) g`+
		fmt.Sprintf(`; UPDATE queen.sink_progress SET last_offset = %d WHERE sink = '%s'`, last+500, r.sink.name)+
		`; COMMIT`)
	pushNumbered(t, b, "nums", 1, 1000, 2000)
	exactlyOnce(t, db, 2000)
	if m := r.sink.moved.Load(); m == 0 {
		t.Fatal("no batch found its known offset moved")
	}
	if got := count(t, db, `SELECT count(*) FROM nums WHERE pad = 'other'`); got != 500 {
		t.Fatalf("%d rows of the other writer, want 500", got)
	}
	waitFor(t, "the sink's offset past the other writer's", 30*time.Second, func() error {
		if got := count(t, db, `SELECT last_offset FROM queen.sink_progress WHERE sink = '`+r.sink.name+`'`); got != last+1000 {
			return fmt.Errorf("last_offset %d, want %d", got, last+1000)
		}
		return nil
	})
	if r.metrics.dlq.get() != 0 {
		t.Fatalf("dead letters: %v", r.metrics.dlq.get())
	}
}

// TestAdvanceStatement: the advance moves every row named to its new
// offset when each holds its known one, and fails, recognisably, before
// anything after it runs and moving none, when one holds another, or is
// missing, or is another sink's.
func TestAdvanceStatement(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	exec(t, db, `CREATE SCHEMA queen`, `CREATE TABLE queen.sink_progress (sink text, partition_id bigint, partition text, last_offset bigint,
		updated_at timestamptz DEFAULT now(), PRIMARY KEY (sink, partition_id))`,
		`INSERT INTO queen.sink_progress VALUES ('s', 1, 'a', 10), ('s', 2, 'b', 20), ('t', 3, 'c', 30)`,
		`CREATE TABLE after_check (x int)`)
	c, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "PREPARE "+stmtAdvance+" (text, text, text, text) AS "+advanceSQL("queen.sink_progress")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pids, known, next string
		moved             bool
		after             []string // the progress rows afterwards
	}{
		{`{1,2}`, `{10,20}`, `{15,20}`, false, []string{"s | 1 | 15", "s | 2 | 20", "t | 3 | 30"}},
		{`{2}`, `{20}`, `{25}`, false, []string{"s | 1 | 15", "s | 2 | 25", "t | 3 | 30"}},
		{`{1,2}`, `{15,21}`, `{16,30}`, true, nil},
		{`{1}`, `{14}`, `{20}`, true, nil},
		{`{1,4}`, `{15,0}`, `{20,5}`, true, nil}, // no row
		{`{3}`, `{30}`, `{31}`, true, nil},       // another sink's
	} {
		before := query(t, db, `SELECT sink, partition_id, last_offset FROM queen.sink_progress ORDER BY 1, 2`)
		// one implicit transaction, as the sink sends it
		q := "EXECUTE " + stmtAdvance + "('s', '" + tc.pids + "', '" + tc.known + "', '" + tc.next + "'); INSERT INTO after_check VALUES (1)"
		_, err := c.PgConn().Exec(ctx, q).ReadAll()
		if progressMoved(err) != tc.moved {
			t.Fatalf("%s: err %v, want moved %v", tc.pids, err, tc.moved)
		}
		want := tc.after
		if tc.moved {
			want = before
		}
		if got := query(t, db, `SELECT sink, partition_id, last_offset FROM queen.sink_progress ORDER BY 1, 2`); !slices.Equal(got, want) {
			t.Fatalf("%s: progress rows %q, want %q", tc.pids, got, want)
		}
	}
	if got := count(t, db, `SELECT count(*) FROM after_check`); got != 2 {
		t.Fatalf("%d statements after the advance ran, want 2 (the passing ones')", got)
	}
}
