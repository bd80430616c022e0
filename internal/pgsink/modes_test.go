package pgsink

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// TestUpsertKeepsUnnamedColumns: an update changes only the columns the
// message names; an insert gives the others their DEFAULT; an explicit
// null sets NULL; a repeated key in one batch is applied in order.
func TestUpsertKeepsUnnamedColumns(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE acc (id int PRIMARY KEY, name text, balance numeric DEFAULT 0, note text DEFAULT 'none')`,
		`INSERT INTO acc VALUES (1, 'old', 5, 'keep')`)
	b := openBroker(t)
	push(t, b, "acc", "1", `{"id":1,"balance":"10.5"}`, `{"id":1,"name":"Ada"}`)
	push(t, b, "acc", "2", `{"id":2,"name":"Bob"}`, `{"id":2,"note":null}`)
	r := startSink(t, b, "acc", db, sinkSpec("acc", "public.acc", "upsert"))
	waitFor(t, "4 applied", 30e9, func() error {
		if r.metrics.applied.get() != 4 {
			return fmt.Errorf("applied %v", r.metrics.applied.get())
		}
		return nil
	})
	got := query(t, db, `SELECT id, name, balance, note FROM acc ORDER BY id`)
	want := []string{"1 | Ada | 10.5 | keep", "2 | Bob | 0 | NULL"}
	if !slices.Equal(got, want) {
		t.Fatalf("rows %q, want %q", got, want)
	}
	if c := r.sink.copied.Load(); c != 4 {
		t.Fatalf("COPY wrote %d rows, want 4", c)
	}
}

// TestUpsertNamedKey: sink.key picks a unique index other than the
// primary key; a message without the key is refused, then dead-lettered.
func TestUpsertNamedKey(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE u (id bigserial PRIMARY KEY, email text NOT NULL UNIQUE, n int)`)
	b := openBroker(t)
	spec := sinkSpec("u", "public.u", "upsert")
	spec.Key = []string{"email"}
	spec.MaxAttempts = 1
	push(t, b, "u", "a", `{"email":"a@x","n":1}`, `{"n":2}`, `{"email":"a@x","n":3}`)
	r := startSink(t, b, "u", db, spec)
	waitFor(t, "applied 2, dlq 1", 30e9, func() error {
		if r.metrics.applied.get() != 2 || r.metrics.dlq.get() != 1 {
			return fmt.Errorf("applied %v dlq %v", r.metrics.applied.get(), r.metrics.dlq.get())
		}
		return nil
	})
	if got := query(t, db, `SELECT email, n FROM u`); !slices.Equal(got, []string{"a@x | 3"}) {
		t.Fatalf("rows %q", got)
	}
	dl, _, err := b.DLQ(context.Background(), "default", "u", "pg-u", "", 10, 0)
	if err != nil || len(dl) != 1 || !strings.Contains(dl[0].Error, `no value for key column "email"`) {
		t.Fatalf("dlq %+v %v", dl, err)
	}
}

// TestRefusedValueDeadLettered: a value PostgreSQL refuses is tried
// maxAttempts times, then dead-lettered with PostgreSQL's own error text;
// the messages after it, in its partition and in others, are written, and
// the progress row moves past it only once it is dead-lettered.
func TestRefusedValueDeadLettered(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE m (id int PRIMARY KEY, qty int CHECK (qty >= 0))`)
	b := openBroker(t)
	push(t, b, "m", "p", `{"id":1,"qty":1}`, `{"id":2,"qty":"lots"}`, `{"id":3,"qty":3}`, `{"id":4,"qty":-1}`, `{"id":5,"qty":5}`)
	push(t, b, "m", "q", `{"id":10,"qty":10}`)
	r := startSink(t, b, "m", db, sinkSpec("m", "public.m", "append"))
	waitCount(t, db, `SELECT count(*) FROM m`, 4)
	waitFor(t, "two dead letters", 30e9, func() error {
		if r.metrics.dlq.get() != 2 {
			return fmt.Errorf("dlq %v", r.metrics.dlq.get())
		}
		return nil
	})
	if got := query(t, db, `SELECT id FROM m ORDER BY id`); !slices.Equal(got, []string{"1", "3", "5", "10"}) {
		t.Fatalf("rows %q", got)
	}
	dl, _, err := b.DLQ(context.Background(), "default", "m", "pg-m", "", 10, 0)
	if err != nil || len(dl) != 2 {
		t.Fatalf("dlq %+v %v", dl, err)
	}
	sort.Slice(dl, func(i, j int) bool { return dl[i].Offset < dl[j].Offset })
	if !strings.Contains(dl[0].Error, `invalid input syntax for type integer: "lots"`) || dl[0].Attempts != 3 {
		t.Fatalf("first dead letter: %+v", dl[0])
	}
	if !strings.Contains(dl[1].Error, `violates check constraint "m_qty_check"`) {
		t.Fatalf("second dead letter: %+v", dl[1])
	}
	if got := query(t, db, `SELECT partition, last_offset FROM queen.sink_progress ORDER BY partition`); !slices.Equal(got, []string{"p | 4", "q | 0"}) {
		t.Fatalf("progress %q", got)
	}
	if p := r.sink.populated.Load(); p == 0 {
		t.Fatal("no row went one message at a time, yet a batch held a refused value")
	}
}

// TestCDC applies change events: c and r upsert after, u keeps its
// unchanged columns, a u whose key changed moves the row, d deletes, t
// truncates.
func TestCDC(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE o (id int PRIMARY KEY, status text, big text, total numeric(12,2))`)
	b := openBroker(t)
	r := startSink(t, b, "o", db, sinkSpec("o", "public.o", "cdc"))
	push(t, b, "o", "1",
		`{"op":"r","table":"public.o","key":{"id":1},"after":{"id":1,"status":"new","big":"LARGE","total":42.00},"before":null}`,
		`{"op":"u","table":"public.o","key":{"id":1},"after":{"id":1,"status":"paid","total":42.00},"before":null,"unchanged":["big"]}`)
	push(t, b, "o", "2",
		`{"op":"c","table":"public.o","key":{"id":2},"after":{"id":2,"status":"new","big":"B2","total":"17.50"},"before":null}`,
		`{"op":"u","table":"public.o","key":{"id":3},"after":{"id":3,"status":"moved","big":"B2","total":17.50},"before":{"id":2}}`)
	push(t, b, "o", "4",
		`{"op":"c","table":"public.o","key":{"id":4},"after":{"id":4,"status":"x","big":null,"total":1},"before":null}`,
		`{"op":"d","table":"public.o","key":{"id":4},"after":null,"before":{"id":4}}`)
	waitFor(t, "6 applied", 30e9, func() error {
		if r.metrics.applied.get() != 6 {
			return fmt.Errorf("applied %v", r.metrics.applied.get())
		}
		return nil
	})
	got := query(t, db, `SELECT id, status, big, total FROM o ORDER BY id`)
	want := []string{"1 | paid | LARGE | 42.00", "3 | moved | B2 | 17.50"}
	if !slices.Equal(got, want) {
		t.Fatalf("rows %q, want %q", got, want)
	}
	push(t, b, "o", "all", `{"op":"t","table":"public.o"}`, `{"op":"c","key":{"id":9},"after":{"id":9,"status":"after truncate"}}`)
	waitFor(t, "truncated", 30e9, func() error {
		got := query(t, db, `SELECT id, status FROM o ORDER BY id`)
		if !slices.Equal(got, []string{"9 | after truncate"}) {
			return fmt.Errorf("rows %q", got)
		}
		return nil
	})
}

// TestSQLMode runs the statement once per message with every kind of
// parameter, all passed as text; a missing path is NULL.
func TestSQLMode(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric NOT NULL DEFAULT 0)`,
		`CREATE TABLE seen (whole jsonb, a_b text, line0 text, missing text, part text, pid bigint, off bigint, tx text, at timestamptz)`,
		`INSERT INTO accounts VALUES (1, 100), (2, 0)`)
	b := openBroker(t)
	pay := sinkSpec("payments", "public.accounts", "sql")
	pay.Statement = "UPDATE accounts SET balance = balance + $1::numeric WHERE id = $2::bigint"
	pay.Params = []string{"$.amount", "$.accountId"}
	push(t, b, "payments", "1", `{"accountId":1,"amount":"0.10"}`, `{"accountId":1,"amount":-50}`, `{"accountId":2,"amount":7}`)
	r := startSink(t, b, "payments", db, pay)
	all := sinkSpec("audit", "public.seen", "sql")
	all.Statement = "INSERT INTO seen VALUES ($1::jsonb, $2, $3, $4, $5, $6::bigint, $7::bigint, $8, $9::timestamptz)"
	all.Params = []string{"$", "$.a.b", "$.lines[0]", "$.nope.x", "@partition", "@partitionId", "@offset", "@transactionId", "@createdAt"}
	push(t, b, "audit", "P", `{"a":{"b":"deep"},"lines":[{"sku":"A1"},2]}`)
	r2 := startSink(t, b, "audit", db, all)
	waitFor(t, "applied", 30e9, func() error {
		if r.metrics.applied.get() != 3 || r2.metrics.applied.get() != 1 {
			return fmt.Errorf("applied %v %v", r.metrics.applied.get(), r2.metrics.applied.get())
		}
		return nil
	})
	if got := query(t, db, `SELECT id, balance FROM accounts ORDER BY id`); !slices.Equal(got, []string{"1 | 50.10", "2 | 7"}) {
		t.Fatalf("accounts %q", got)
	}
	got := query(t, db, `SELECT whole, a_b, line0, missing, part, pid > 0, off, tx <> '', at > now() - interval '1 minute' FROM seen`)
	want := []string{`{"a": {"b": "deep"}, "lines": [{"sku": "A1"}, 2]} | deep | {"sku":"A1"} | NULL | P | t | 0 | t | t`}
	if !slices.Equal(got, want) {
		t.Fatalf("seen %q, want %q", got, want)
	}
}

// TestStartChecks: each setup problem stops the sink in error with its code.
func TestStartChecks(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE nokey (a int)`, `CREATE TABLE t (id int PRIMARY KEY, g int GENERATED ALWAYS AS (id) STORED)`,
		`DO $$ BEGIN CREATE ROLE weak LOGIN PASSWORD 'weak'; EXCEPTION WHEN duplicate_object THEN NULL; END $$`, `GRANT USAGE ON SCHEMA public TO weak`, `GRANT SELECT ON t TO weak`)
	b := openBroker(t)
	cases := []struct {
		name string
		mod  func(s *sinkSpecT)
		url  string
		code string
	}{
		{"missing", func(s *sinkSpecT) { s.Table = "public.nope" }, "", "table_missing"},
		{"nokey", func(s *sinkSpecT) { s.Table, s.Mode = "public.nokey", "upsert" }, "", "no_key"},
		{"badkey", func(s *sinkSpecT) { s.Mode, s.Key = "cdc", []string{"g"} }, "", "no_key"},
		{"meta-generated", func(s *sinkSpecT) { s.Metadata = map[string]string{"offset": "g"} }, "", "metadata_column"},
		{"meta-missing", func(s *sinkSpecT) { s.Metadata = map[string]string{"offset": "nope"} }, "", "metadata_column"},
		{"statement", func(s *sinkSpecT) { s.Mode, s.Statement, s.Params = "sql", "UPDATE t SET id = $1 WHERE", []string{"$"} }, "", "statement"},
		{"progress", func(s *sinkSpecT) { s.ProgressTable = "public.t" }, "", "progress_table"},
		{"progress-not-created", func(s *sinkSpecT) { f := false; s.CreateProgressTable = &f; s.ProgressTable = "queen.absent" }, "", "progress_table"},
		{"permission", func(s *sinkSpecT) { s.ProgressTable = "public.t" + "x" }, "weak", "progress_table"},
		{"permission-table", func(s *sinkSpecT) {}, "weak-progress", "permission"},
	}
	exec(t, db, `CREATE TABLE queen_p (sink text, partition_id bigint, partition text, last_offset bigint, updated_at timestamptz DEFAULT now(), PRIMARY KEY (sink, partition_id))`,
		`GRANT SELECT, INSERT, UPDATE ON queen_p TO weak`)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := sinkSpec("q", "public.t", "append")
			c.mod(spec)
			u := db
			switch c.url {
			case "weak":
				u = asRole(db, "weak", "weak")
			case "weak-progress":
				u = asRole(db, "weak", "weak")
				spec.ProgressTable = "public.queen_p"
				f := false
				spec.CreateProgressTable = &f
			}
			r := startSink(t, b, "chk-"+c.name, u, spec)
			st := waitPhase(t, r, "error", c.code)
			if st.Message == "" {
				t.Fatal("an error without a sentence")
			}
			t.Logf("%s: %s", c.code, st.Message)
		})
	}
}

type sinkSpecT = connector.SinkSpec

var _ = broker.MaxBatch

// TestOneStatementPerRun: a batch of 500 appends, and one of 500 upserts
// of distinct keys, each reach the table as one statement (a
// statement-level trigger counts them), through COPY.
func TestOneStatementPerRun(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE stmts (tbl text, n int)`,
		`CREATE FUNCTION count_stmt() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO stmts VALUES (TG_TABLE_NAME, 1); RETURN NULL; END $$`,
		`CREATE TABLE ap (n int, pad text)`, `CREATE TABLE up (n int PRIMARY KEY, pad text)`,
		`CREATE TRIGGER c AFTER INSERT ON ap FOR EACH STATEMENT EXECUTE FUNCTION count_stmt()`,
		`CREATE TRIGGER c AFTER INSERT ON up FOR EACH STATEMENT EXECUTE FUNCTION count_stmt()`)
	b := openBroker(t)
	var ap, up []string
	for i := 0; i < 500; i++ {
		ap = append(ap, fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, pad))
		up = append(up, fmt.Sprintf(`{"n":%d,"pad":"v1"}`, i))
	}
	push(t, b, "ap", "p", ap...)
	push(t, b, "up", "p", up...)
	ra := startSink(t, b, "ap", db, sinkSpec("ap", "public.ap", "append"))
	ru := startSink(t, b, "up", db, sinkSpec("up", "public.up", "upsert"))
	waitCount(t, db, `SELECT count(*) FROM ap`, 500)
	waitCount(t, db, `SELECT count(*) FROM up`, 500)
	// A worker counts its copied rows once it has read the COMMIT's
	// answer, just after the rows became visible to this session.
	waitFor(t, "rows counted as copied", 10*time.Second, func() error {
		if a, u := ra.sink.copied.Load(), ru.sink.copied.Load(); a != 500 || u != 500 {
			return fmt.Errorf("COPY wrote %d and %d rows, want 500 each", a, u)
		}
		return nil
	})
	if got := query(t, db, `SELECT tbl, count(*) FROM stmts GROUP BY tbl ORDER BY tbl`); !slices.Equal(got, []string{"ap | 1", "up | 1"}) {
		t.Fatalf("statements per table: %q, want one each", got)
	}
}

// TestRuns: consecutive ops of one kind and column set share a statement,
// unless a key repeats; truncates stand alone.
func TestRuns(t *testing.T) {
	mk := func(kind opKind, cols, key string) *op { return &op{kind: kind, colKey: cols, key: key} }
	ops := []*op{
		mk(opUpsert, "a", "1"), mk(opUpsert, "a", "2"), mk(opUpsert, "a", "1"), // a repeated key splits
		mk(opUpsert, "a,b", "3"),                         // other columns split
		mk(opDelete, "id", "4"), mk(opDelete, "id", "5"), // deletes group
		mk(opTruncate, "", ""), mk(opTruncate, "", ""), // truncates alone
		mk(opInsert, "x", ""), mk(opInsert, "x", ""), mk(opInsert, "x", ""), // inserts group, no key
	}
	var sizes []int
	for _, r := range runs(ops) {
		sizes = append(sizes, len(r))
	}
	if want := []int{2, 1, 1, 2, 1, 1, 3}; !slices.Equal(sizes, want) {
		t.Fatalf("run sizes %v, want %v", sizes, want)
	}
}

// TestScanObject: the top-level scanner agrees with encoding/json on keys
// and raw values, and refuses what is not one JSON object.
func TestScanObject(t *testing.T) {
	good := []string{`{}`, ` { "a" : 1 , "b":"x,}" ,"c":{"d":[1,{"e":"]"}]},"\u0041":null, "f":true, "g":-1.5e3} `, `{"a\"b":[]}`}
	for _, g := range good {
		var want map[string]json.RawMessage
		if err := json.Unmarshal([]byte(g), &want); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		if err := scanObject([]byte(strings.TrimSpace(g)), func(k string, v []byte) { got[k] = string(v) }); err != nil {
			t.Fatalf("%s: %v", g, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: keys %v, want %v", g, got, want)
		}
		for k, v := range want {
			if got[k] != string(v) {
				t.Fatalf("%s: key %q = %q, want %q", g, k, got[k], v)
			}
		}
	}
	for _, b := range []string{`{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1} x`, `{"a":"x}`, `[1]`, `{"a":[1}`} {
		if err := scanObject([]byte(b), func(string, []byte) {}); err == nil {
			t.Fatalf("%s: accepted", b)
		}
	}
}

// TestDeferredConstraintRefused: a deferred unique constraint that only
// fails at COMMIT still pins the refusal on the one message that breaks
// it; the others are written.
func TestDeferredConstraintRefused(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE d (id int, v text, CONSTRAINT d_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`)
	b := openBroker(t)
	push(t, b, "d", "p", `{"id":1,"v":"a"}`, `{"id":2,"v":"b"}`, `{"id":3,"v":"a"}`, `{"id":4,"v":"c"}`)
	spec := sinkSpec("d", "public.d", "append")
	spec.MaxAttempts = 1
	r := startSink(t, b, "d", db, spec)
	waitFor(t, "one dead letter", 30*time.Second, func() error {
		if r.metrics.dlq.get() != 1 || r.metrics.applied.get() != 3 {
			return fmt.Errorf("dlq %v applied %v", r.metrics.dlq.get(), r.metrics.applied.get())
		}
		return nil
	})
	if got := query(t, db, `SELECT id FROM d ORDER BY id`); !slices.Equal(got, []string{"1", "2", "4"}) {
		t.Fatalf("rows %q", got)
	}
	dl, _, err := b.DLQ(context.Background(), "default", "d", "pg-d", "", 10, 0)
	if err != nil || len(dl) != 1 || dl[0].Offset != 2 || !strings.Contains(dl[0].Error, `"d_v"`) {
		t.Fatalf("dlq %+v %v", dl, err)
	}
}
