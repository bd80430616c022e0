package pgsink

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// directWorker is a worker of a sink on table, started with the start
// checks, that applies batches handed to it (no broker). populate forces
// every row onto the populate path.
func directWorker(t *testing.T, db, table, mode string, populate bool, meta map[string]string) *worker {
	t.Helper()
	spec := sinkSpec("x", "public."+table, mode)
	spec.Metadata = meta
	env, _ := envFor(nil, "direct-"+table, connFor(db), spec)
	env.Broker = &broker.Broker{}
	rn, err := New(env)
	if err != nil {
		t.Fatal(err)
	}
	sk := rn.(*sink)
	conn, p, err := sk.connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if populate {
		p.copy = nil
	} else if p.copy == nil {
		t.Fatalf("table %s does not take the COPY path", table)
	}
	return &worker{s: sk, conn: conn, plan: p, stmts: map[string]string{}}
}

var testCreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.UTC)

// messages makes a batch of payloads; each its own partition when apart.
func messages(payloads []string, firstOffset int, apart bool) []broker.Delivery {
	msgs := make([]broker.Delivery, len(payloads))
	for i, pl := range payloads {
		pid := uint64(1)
		if apart {
			pid = uint64(100 + i)
		}
		msgs[i] = broker.Delivery{Partition: fmt.Sprintf("p%d", pid), PartitionID: pid, Offset: uint64(firstOffset + i),
			TxID: fmt.Sprintf("tx-%d", firstOffset+i), CreatedAt: testCreatedAt.UnixMicro(), Payload: []byte(pl), Attempt: 1}
	}
	return msgs
}

// outcomes is each message's state and error, in batch order.
func outcomes(res *result) []string {
	var out []string
	for _, it := range res.items {
		out = append(out, fmt.Sprintf("%d %d %s", it.m.Offset, it.state, it.errText))
	}
	return out
}

const allTypes = `(
  seq bigserial, t text, vc varchar(20), ch char(5), i2 int2, i4 int4, i8 int8, n numeric, n2 numeric(12,2),
  f4 float4, f8 float8, b bool, j json, jb jsonb, u uuid, d date, tm time, ts timestamp, tz timestamptz,
  iv interval, ip inet, e mood, dom posint, by bytea, r int4range, dflt text DEFAULT 'dflt',
  m_part text, m_off bigint, m_tx text, m_at timestamptz, m_payload jsonb)`

const allCols = `t, vc, ch, i2, i4, i8, n, n2, f4, f8, b, j, jb, u, d, tm, ts, tz, iv, ip, e, dom, by, r, dflt, m_part, m_off, m_tx, m_at, m_payload`

var allMeta = map[string]string{"partition": "m_part", "offset": "m_off", "transactionId": "m_tx", "createdAt": "m_at", "payload": "m_payload"}

// TestCopyMatchesPopulate: a table whose every column type takes the COPY
// path gets, row by row, exactly what the populate path writes for the same
// messages: tricky strings, \N-looking text, unicode, big numbers, nulls,
// missing keys, nested json, metadata; the values the COPY path leaves to
// populate (exponents, negative zero, nested values into json) too. A
// second batch of refused values ends with the same outcomes and errors.
func TestCopyMatchesPopulate(t *testing.T) {
	t.Run("metadata", func(t *testing.T) { copyMatchesPopulate(t, allMeta) })
	t.Run("plain", func(t *testing.T) { copyMatchesPopulate(t, nil) })
}

func copyMatchesPopulate(t *testing.T, meta map[string]string) {
	db := newDB(t)
	exec(t, db, `CREATE TYPE mood AS ENUM ('sad', 'happy')`, `CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
		`CREATE TABLE via_copy `+allTypes, `CREATE TABLE via_populate `+allTypes)
	cases := []struct {
		msg  string
		copy bool // the COPY path writes it (else it goes through populate)
	}{
		{`{"t":"a\"b\\c\td\ne\rf","vc":"x"}`, true},
		{`{"t":"\\N","vc":"\\.","ch":"N"}`, true},
		{`{"t":"NULL","vc":"","ch":"ab"}`, true},
		{`{"t":"h\u00e9llo ✓ \ud83d\ude00 \/ \b\f","vc":"日本語"}`, true},
		{`{"n":123456789012345678901234567890.123456789012,"n2":"12.345","i8":9223372036854775807,"i2":-32768}`, true},
		{`{"t":1.50,"vc":true,"ch":false,"n":0.000,"n2":-0.5}`, true},
		{`{"t":null,"j":null,"jb":null,"dom":null,"dflt":null}`, true},
		{`{"jb":{"b":1,"a":"x\ty","a":[1,{"c":null}]},"j":"a\"\\\u0001b\n"}`, true},
		{`{"j":12.50,"jb":12.50}`, true},
		{`{"j":true,"jb":"s\\N"}`, true},
		{`{"i4":5}`, true},
		{`{"b":"yes","i4":"42","f4":0.1,"f8":1.7976931348623157}`, true},
		{`{"u":"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11","d":"2024-02-29","tm":"13:45:00.123","ts":"2024-01-01T00:00:00","tz":"2024-01-01T00:00:00+02:00"}`, true},
		{`{"iv":"1 day 2 hours","ip":"10.0.0.1/8","e":"happy","dom":3,"by":"\\x414243","r":"[1,5)"}`, true},
		{` { "t" : "spaced" , "i4" : 7 } `, true},
		{`{"t":"first","t":"second"}`, true},
		{`{"t":"x","zz":{"deep":[1,{"a":null}],"s":"\u00e9"},"T":"other case, no column"}`, true},
		{`{"i4":1,"m_off":77,"m_part":"a key the metadata column overrides"}`, true},
		{`{"f8":1e3,"i4":1E2}`, false},
		{`{"n":-0.0,"t":-0}`, false},
		{`{"j":{"b":1, "a":[1,2]}}`, false},
		{`{"t":{"nested":"into text"}}`, false},
		{`{"t":"x","zz":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, false},
	}
	// Random strings of the characters that matter to COPY and JSON,
	// into text, json and jsonb.
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	alphabet := []string{`\\`, `\"`, `\t`, `\n`, `\r`, `\u0001`, `\u001f`, `\/`, `N`, `.`, `'`, ` `, "é", "✓", `\u00e9`, `\ud83d\ude00`, `a`, `,`, `}`, `\\N`}
	for i := 0; i < 60; i++ {
		var sb strings.Builder
		for n := rng.IntN(12); n > 0; n-- {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		s := sb.String()
		cases = append(cases, struct {
			msg  string
			copy bool
		}{fmt.Sprintf(`{"t":"%s",	"j":"%s","jb":{"k":"%s"}}`, s, s, s), true})
	}
	if meta != nil {
		// Not objects: only the payload column holds them. No column but
		// the metadata ones.
		cases = append(cases, struct {
			msg  string
			copy bool
		}{`"a string message"`, true}, struct {
			msg  string
			copy bool
		}{`[1,"two",{"three":3}]`, true}, struct {
			msg  string
			copy bool
		}{`{"T":"no column but the metadata ones"}`, true})
	}
	var payloads []string
	want := 0
	wc := directWorker(t, db, "via_copy", "append", false, meta)
	for i, c := range cases {
		payloads = append(payloads, c.msg)
		m := messages([]string{c.msg}, i, false)[0]
		ops, err := wc.s.decode(wc.plan, &m)
		if err != nil || len(ops) != 1 {
			t.Fatalf("%s: %v", c.msg, err)
		}
		if got := ops[0].copy != nil; got != c.copy {
			t.Errorf("%s: takes COPY %v, want %v", c.msg, got, c.copy)
		}
		if c.copy {
			want++
		}
	}
	wp := directWorker(t, db, "via_populate", "append", true, meta)
	ctx := context.Background()
	for _, w := range []*worker{wc, wp} {
		res, err := w.apply(ctx, messages(payloads, 0, false), nil)
		if err != nil || res.applied != len(payloads) {
			t.Fatalf("%s: %v %+v", w.s.table, err, outcomes(res))
		}
	}
	if c, p := wc.s.copied.Load(), wc.s.populated.Load(); c != int64(want) || p != int64(len(payloads)-want) {
		t.Fatalf("COPY wrote %d rows and populate %d, want %d and %d", c, p, want, len(payloads)-want)
	}
	if c := wp.s.copied.Load(); c != 0 {
		t.Fatalf("the populate worker copied %d rows", c)
	}
	compareTables(t, db, meta != nil)

	// Refused values, each in a partition of its own, among good ones.
	refused := []string{
		`{"i4":"lots"}`, `{"t":"ok 1"}`, `{"t":"x","junk":tru}`, `{"t":"\u0000"}`, `{"t":"\ud800"}`, `{"dom":-1}`,
		`{"t":"ok 2"}`, `{"vc":"this string is longer than twenty"}`, `{"e":"angry"}`, `{"t":"x","n":1e999999}`, `{"t":"ok 3"}`,
	}
	var outs [][]string
	for _, w := range []*worker{wc, wp} {
		res, err := w.apply(ctx, messages(refused, 1000, true), nil)
		if err != nil {
			t.Fatalf("%s: %v", w.s.table, err)
		}
		outs = append(outs, outcomes(res))
		if res.applied != 3 || res.refused != 8 {
			t.Fatalf("%s: %+v", w.s.table, outcomes(res))
		}
	}
	if !slices.Equal(outs[0], outs[1]) {
		t.Fatalf("outcomes differ:\n COPY     %q\n populate %q", outs[0], outs[1])
	}
	for _, o := range outs[0] {
		if strings.HasPrefix(o, "1000 ") && !strings.Contains(o, `invalid input syntax for type integer: "lots" [SQLSTATE 22P02]`) {
			t.Fatalf("outcome %q", o)
		}
	}
	compareTables(t, db, meta != nil)
}

func compareTables(t *testing.T, db string, meta bool) {
	t.Helper()
	order := "m_off"
	if !meta {
		order = "i4, t, jb::text, seq" // no offset column: by content (the refused batch burns sequence numbers)
	}
	compareTablesBy(t, db, allCols, order)
}

// compareTablesBy requires via_copy and via_populate to hold the same
// rows of cols in the given order.
func compareTablesBy(t *testing.T, db, cols, order string) {
	t.Helper()
	a := query(t, db, `SELECT `+cols+` FROM via_copy ORDER BY `+order)
	b := query(t, db, `SELECT `+cols+` FROM via_populate ORDER BY `+order)
	if len(a) != len(b) {
		t.Fatalf("%d rows by COPY, %d by populate", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("row %d:\n COPY     %q\n populate %q", i, a[i], b[i])
		}
	}
}

// TestCopyPlan: the path is decided per column from the table's
// definition: arrays, composites (also under a domain) and GENERATED
// ALWAYS identity columns stay on populate; a table with rules or
// row-level security takes populate only, and so does an upsert whose key
// cannot be copied.
func TestCopyPlan(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TYPE pt AS (x int, y int)`, `CREATE DOMAIN ints AS int[]`, `CREATE DOMAIN word AS text CHECK (VALUE <> '')`,
		`CREATE DOMAIN doc AS jsonb`,
		`CREATE TABLE mixed (id int GENERATED ALWAYS AS IDENTITY, k int GENERATED BY DEFAULT AS IDENTITY, a text[], c pt, di ints, w word, dj doc, j json, g int GENERATED ALWAYS AS (k) STORED)`,
		`CREATE TABLE ruled (v text)`, `CREATE TABLE audit (v text)`, `CREATE RULE r AS ON INSERT TO ruled DO ALSO INSERT INTO audit VALUES (NEW.v)`,
		`CREATE TABLE secured (v text)`, `ALTER TABLE secured ENABLE ROW LEVEL SECURITY`,
		`CREATE TABLE arrkey (k int[] PRIMARY KEY, v text)`)
	w := directWorker(t, db, "mixed", "append", false, nil)
	got := map[string]conv{}
	for c, v := range w.plan.copy.conv {
		got[c] = v
	}
	want := map[string]conv{"k": convText, "w": convText, "dj": convJSONB, "j": convJSON}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("COPY columns %v, want %v", got, want)
	}
	for _, c := range []struct{ table, mode string }{{"ruled", "append"}, {"secured", "append"}, {"arrkey", "upsert"}} {
		spec := sinkSpec("x", "public."+c.table, c.mode)
		env, _ := envFor(nil, "plan-"+c.table, connFor(db), spec)
		env.Broker = &broker.Broker{}
		rn, _ := New(env)
		conn, p, err := rn.(*sink).connect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conn.Close(context.Background())
		if p.copy != nil {
			t.Fatalf("%s takes the COPY path", c.table)
		}
	}
	// The rule still runs: the rows go through INSERT.
	b := openBroker(t)
	push(t, b, "ruled", "p", `{"v":"one"}`)
	r := startSink(t, b, "ruled", db, sinkSpec("ruled", "public.ruled", connector.ModeAppend))
	waitCount(t, db, `SELECT count(*) FROM audit WHERE v = 'one'`, 1)
	if c := r.sink.copied.Load(); c != 0 {
		t.Fatalf("copied %d rows into a table with a rule", c)
	}
}

// TestCopyRefusedMidBatch: a value PostgreSQL refuses in the middle of a
// COPY batch is dead-lettered with PostgreSQL's own error (as the populate
// path words it), every other message is written once, and the batches
// after it take the COPY path again.
func TestCopyRefusedMidBatch(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE cr (id int, qty int, note text)`)
	b := openBroker(t)
	var msgs []string
	for i := 0; i < 1000; i++ {
		q := fmt.Sprint(i)
		if i == 250 {
			q = `"lots"`
		}
		msgs = append(msgs, fmt.Sprintf(`{"id":%d,"qty":%s,"note":"n\t%d"}`, i, q, i))
	}
	push(t, b, "cr", "p", msgs...)
	spec := sinkSpec("cr", "public.cr", "append")
	spec.MaxAttempts = 1
	r := startSink(t, b, "cr", db, spec)
	waitFor(t, "999 applied, 1 dead letter", 60*time.Second, func() error {
		if r.metrics.applied.get() != 999 || r.metrics.dlq.get() != 1 {
			return fmt.Errorf("applied %v dlq %v", r.metrics.applied.get(), r.metrics.dlq.get())
		}
		return nil
	})
	if got := query(t, db, `SELECT count(*), count(DISTINCT id), sum(id), bool_and(note = E'n\t' || id) FROM cr`); got[0] != fmt.Sprintf("999 | 999 | %d | t", 999*1000/2-250) {
		t.Fatalf("rows %q", got)
	}
	dl, _, err := b.DLQ(context.Background(), "default", "cr", "pg-cr", "", 10, 0)
	if err != nil || len(dl) != 1 || dl[0].Offset != 250 || dl[0].Error != `invalid input syntax for type integer: "lots" [SQLSTATE 22P02]` {
		t.Fatalf("dlq %+v %v", dl, err)
	}
	if c := r.sink.copied.Load(); c < 500 {
		t.Fatalf("COPY wrote %d rows; the batches after the refusal should take it", c)
	}
	if p := r.sink.populated.Load(); p < 250 {
		t.Fatalf("populate wrote %d rows; the refused batch should go one message at a time", p)
	}
}

// TestCopyUpsertRepeatedKeys: an upsert batch naming one key several times
// (with different column sets) through the staging table gives the same
// rows, and fires the same row triggers, as the populate path: each
// message applied in offset order, the last one winning.
func TestCopyUpsertRepeatedKeys(t *testing.T) {
	db := newDB(t)
	hits := `CREATE FUNCTION hit_%[1]s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.hits = OLD.hits + 1; INSERT INTO fired_%[1]s VALUES (NEW.id, NEW.v); RETURN NEW; END $$`
	for _, tb := range []string{"uc", "up"} {
		exec(t, db, `CREATE TABLE `+tb+` (id int PRIMARY KEY, v text, n int DEFAULT 7, hits int DEFAULT 0)`,
			`CREATE TABLE fired_`+tb+` (id int, v text, at serial)`, fmt.Sprintf(hits, tb),
			`CREATE TRIGGER h BEFORE UPDATE ON `+tb+` FOR EACH ROW EXECUTE FUNCTION hit_`+tb+`()`)
	}
	batch := []string{`{"id":1,"v":"a"}`, `{"id":2,"v":"b"}`, `{"id":1,"v":"c"}`, `{"id":1,"n":5}`, `{"id":2,"v":"d"}`,
		`{"id":1,"v":"e"}`, `{"id":3,"v":"x\ty","n":null}`, `{"id":3,"v":"z"}`}
	ctx := context.Background()
	wc := directWorker(t, db, "uc", "upsert", false, nil)
	wp := directWorker(t, db, "up", "upsert", true, nil)
	for _, w := range []*worker{wc, wp} {
		for round := 0; round < 2; round++ { // the second: every row exists
			res, err := w.apply(ctx, messages(batch, round*len(batch), false), nil)
			if err != nil || res.applied != len(batch) {
				t.Fatalf("%s: %v", w.s.table, err)
			}
		}
	}
	if c := wc.s.copied.Load(); c != int64(2*len(batch)) {
		t.Fatalf("COPY wrote %d rows, want %d", c, 2*len(batch))
	}
	want := []string{"1 | e | 5 | 7", "2 | d | 7 | 3", "3 | z | NULL | 3"}
	for _, tb := range []string{"uc", "up"} {
		if got := query(t, db, `SELECT id, v, n, hits FROM `+tb+` ORDER BY id`); !slices.Equal(got, want) {
			t.Fatalf("%s: rows %q, want %q", tb, got, want)
		}
	}
	if a, b := query(t, db, `SELECT id, v FROM fired_uc ORDER BY at`), query(t, db, `SELECT id, v FROM fired_up ORDER BY at`); !slices.Equal(a, b) || len(a) != 13 {
		t.Fatalf("triggers fired\n COPY     %q\n populate %q", a, b)
	}
	// A refused repeated key stops its partition there; the same on both.
	exec(t, db, `ALTER TABLE uc ADD CHECK (n > 0)`, `ALTER TABLE up ADD CHECK (n > 0)`)
	bad := []string{`{"id":1,"v":"f"}`, `{"id":1,"n":-1}`, `{"id":1,"v":"g"}`}
	var outs [][]string
	for _, w := range []*worker{wc, wp} {
		res, err := w.apply(ctx, messages(bad, 2*len(batch), false), nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range outcomes(res) {
			out = append(out, strings.ReplaceAll(o, `"`+w.s.table.name, `"t`)) // the table's name aside
		}
		outs = append(outs, out)
	}
	if !slices.Equal(outs[0], outs[1]) || !strings.Contains(outs[0][1], "violates check constraint") {
		t.Fatalf("outcomes\n COPY     %q\n populate %q", outs[0], outs[1])
	}
	for _, tb := range []string{"uc", "up"} {
		if got := query(t, db, `SELECT v FROM `+tb+` WHERE id = 1`); !slices.Equal(got, []string{"f"}) {
			t.Fatalf("%s: %q", tb, got)
		}
	}
}

// TestUpsertWithoutTemporaryPrivilege: a role that may not create
// temporary tables cannot stage its COPY, so its upserts go through
// populate, with the same rows.
func TestUpsertWithoutTemporaryPrivilege(t *testing.T) {
	db := newDB(t)
	exec(t, db, `DO $$ BEGIN CREATE ROLE notemp LOGIN PASSWORD 'notemp'; EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
		`DO $$ BEGIN EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database()); END $$`,
		`CREATE TABLE nt (id int PRIMARY KEY, v text)`, `GRANT SELECT, INSERT, UPDATE ON nt TO notemp`,
		`CREATE SCHEMA queen`, `CREATE TABLE queen.sink_progress (sink text, partition_id bigint, partition text, last_offset bigint, updated_at timestamptz DEFAULT now(), PRIMARY KEY (sink, partition_id))`,
		`GRANT USAGE ON SCHEMA queen TO notemp`, `GRANT SELECT, INSERT, UPDATE ON queen.sink_progress TO notemp`)
	b := openBroker(t)
	push(t, b, "nt", "p", `{"id":1,"v":"a"}`, `{"id":2,"v":"b"}`, `{"id":1,"v":"c"}`)
	spec := sinkSpec("nt", "public.nt", "upsert")
	f := false
	spec.CreateProgressTable = &f
	r := startSink(t, b, "nt", asRole(db, "notemp", "notemp"), spec)
	waitFor(t, "3 applied", 30*time.Second, func() error {
		if r.metrics.applied.get() != 3 {
			return fmt.Errorf("applied %v", r.metrics.applied.get())
		}
		return nil
	})
	if got := query(t, db, `SELECT id, v FROM nt ORDER BY id`); !slices.Equal(got, []string{"1 | c", "2 | b"}) {
		t.Fatalf("rows %q", got)
	}
	if c, p := r.sink.copied.Load(), r.sink.populated.Load(); c != 0 || p != 3 {
		t.Fatalf("COPY wrote %d rows and populate %d, want 0 and 3", c, p)
	}
}

// TestFastRowOpAgrees: the one-pass mapping of a common message gives the
// same op as the general one, in append and upsert mode, and takes the
// benchmark's messages.
func TestFastRowOpAgrees(t *testing.T) {
	cols := []string{"id", "t", "n", "j", "jb", "b"}
	cp := &copyPlan{conv: map[string]conv{"id": convText, "t": convText, "n": convText, "j": convJSON, "jb": convJSONB, "b": convText}}
	msgs := []string{
		`{"id":1,"t":"x"}`, ` {"t" : "a\"b\\c\td" , "id" : 2 } `, `{"id":3,"id":4,"t":"dup"}`, `{"id":5,"zz":{"deep":[1,2]},"t":null}`,
		`{"id":"6","jb":{"a":[1,{"b":null}]},"j":"s\u0001"}`, `{"id":7,"j":{"a":1}}`, `{"id":8,"n":1e3}`, `{"id":9,"n":-0}`,
		`{"t\u0041":1,"id":10}`, `{"id":null,"t":"nokey"}`, `{"t":"nokey"}`, `{"id":[1],"t":"x"}`, `{"id":11,"b":true,"n":12.50}`,
		`{}`, `[1]`, `"s"`, `{"id":12,"x":tru}`, `{"id":13,"t":"\ud800"}`, `{"id":14,"t":"é✓"}`, "{\"id\":15,\"t\":\"\xff\"}",
		`{"id":16,"t":"a"} x`, `{"id":17,"t":"a",}`, `{"id":18,}`, benchRow(42),
		`{"id":19,"t":"plain","t":"esc\u0041\n"}`, // the last one wins, with its own escapes
	}
	for _, mode := range []string{"append", "upsert"} {
		s := &sink{spec: connector.SinkSpec{Mode: mode}}
		p := &plan{writable: map[string]bool{}, key: []string{"id"}, copy: cp}
		for _, c := range cols {
			p.writable[c] = true
		}
		fast := 0
		for _, msg := range msgs {
			m := &broker.Delivery{Payload: []byte(msg)}
			fo, ok := s.fastRowOp(p, m, nil)
			go_, err := s.rowOp(p, m, m.Payload, nil)
			if !ok {
				continue
			}
			fast++
			if err != nil {
				t.Fatalf("%s %s: the fast path took what the general one refuses: %v", mode, msg, err)
			}
			if fo.kind != go_.kind || !slices.Equal(fo.cols, go_.cols) || fo.colKey != go_.colKey || fo.key != go_.key ||
				string(fo.doc) != string(go_.doc) || string(fo.copy) != string(go_.copy) {
				t.Fatalf("%s %s:\n fast    %+v\n general %+v", mode, msg, fo, go_)
			}
		}
		if want := map[string]int{"append": 11, "upsert": 9}[mode]; fast != want {
			t.Fatalf("%s: the fast path took %d messages, want %d", mode, fast, want)
		}
		p.writable = map[string]bool{"id": true, "customer": true, "amount": true, "status": true, "region": true, "note": true}
		p.copy = &copyPlan{conv: map[string]conv{"id": convText, "customer": convText, "amount": convText, "status": convText, "region": convText, "note": convText}}
		if _, ok := s.fastRowOp(p, &broker.Delivery{Payload: []byte(benchRow(7))}, nil); !ok {
			t.Fatalf("%s: the benchmark's message takes the general path", mode)
		}
	}
}

// TestCopyAppendManyRuns: an append batch whose messages name different
// columns in turn is several runs; they go through the staging table in
// one COPY, each run one INSERT, and give the rows, the defaults, the
// order and the statement triggers of the populate path.
func TestCopyAppendManyRuns(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE stmts (tbl text)`,
		`CREATE FUNCTION count_stmt() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO stmts VALUES (TG_TABLE_NAME); RETURN NULL; END $$`)
	for _, tb := range []string{"rc", "rp"} {
		exec(t, db, `CREATE TABLE `+tb+` (seq bigserial, a int, b text DEFAULT 'dflt', c jsonb)`,
			`CREATE TRIGGER c AFTER INSERT ON `+tb+` FOR EACH STATEMENT EXECUTE FUNCTION count_stmt()`)
	}
	var batch []string
	for i := 0; i < 30; i++ {
		switch i % 3 {
		case 0:
			batch = append(batch, fmt.Sprintf(`{"a":%d}`, i))
		case 1:
			batch = append(batch, fmt.Sprintf(`{"a":%d,"b":"x\t%d"}`, i, i))
		default:
			batch = append(batch, fmt.Sprintf(`{"c":{"i":%d},"a":%d}`, i, i))
		}
	}
	wc := directWorker(t, db, "rc", "append", false, nil)
	wp := directWorker(t, db, "rp", "append", true, nil)
	ctx := context.Background()
	for _, w := range []*worker{wc, wp} {
		res, err := w.apply(ctx, messages(batch, 0, false), nil)
		if err != nil || res.applied != len(batch) {
			t.Fatalf("%s: %v", w.s.table, err)
		}
	}
	if c := wc.s.copied.Load(); c != int64(len(batch)) {
		t.Fatalf("COPY wrote %d rows, want %d", c, len(batch))
	}
	a, b := query(t, db, `SELECT seq, a, b, c FROM rc ORDER BY seq`), query(t, db, `SELECT seq, a, b, c FROM rp ORDER BY seq`)
	if !slices.Equal(a, b) || len(a) != len(batch) || a[1] != "2 | 1 | x\t1 | NULL" {
		t.Fatalf("rows\n COPY     %q\n populate %q", a, b)
	}
	if got := query(t, db, `SELECT tbl, count(*) FROM stmts GROUP BY tbl ORDER BY tbl`); !slices.Equal(got, []string{"rc | 30", "rp | 30"}) {
		t.Fatalf("statements %q", got)
	}
}

// TestFastRowOpArena: COPY lines built into a batch's shared arena are the
// same as lines built alone, whether they fit in it or outgrow it (escapes
// lengthen a line), and a later line never overwrites an earlier one.
func TestFastRowOpArena(t *testing.T) {
	s := &sink{spec: connector.SinkSpec{Mode: "append"}}
	p := &plan{writable: map[string]bool{"id": true, "t": true}, copy: &copyPlan{conv: map[string]conv{"id": convText, "t": convText}}}
	msgs := []string{`{"id":1,"t":"x"}`, `{"id":2,"t":"a\tb\\c\nd\re"}`, `{"id":3,"t":"\\\\\\\\\\\\\\\\"}`, `{"id":4,"t":"yy"}`, benchRow(5), `{"id":6,"t":"z"}`}
	for _, size := range []int{0, 24, 64, 4096} {
		sc := &rowScratch{arena: make([]byte, 0, size)}
		var got [][]byte
		for _, msg := range msgs {
			o, ok := s.fastRowOp(p, &broker.Delivery{Payload: []byte(msg)}, sc)
			if !ok {
				t.Fatalf("arena %d: %s takes the general path", size, msg)
			}
			got = append(got, o.copy)
		}
		for i, msg := range msgs {
			want, _ := s.fastRowOp(p, &broker.Delivery{Payload: []byte(msg)}, nil)
			if string(got[i]) != string(want.copy) {
				t.Fatalf("arena %d, %s: line %q, want %q", size, msg, got[i], want.copy)
			}
		}
		if len(sc.arena) > size {
			t.Fatalf("arena %d grew to %d", size, len(sc.arena))
		}
	}
}

// TestFastRowOpLayout: messages mapped with one batch's scratch (the last
// message's key layout reused when the next has the same keys in the same
// order) give the ops they give alone, whatever the order of layouts,
// repeated keys and keys that are not columns.
func TestFastRowOpLayout(t *testing.T) {
	msgs := []string{
		`{"id":1,"t":"a","zz":0}`, `{"id":2,"t":"b","zz":0}`, `{"t":"c","id":3,"zz":0}`, `{"t":"d","id":4,"zz":0}`,
		`{"id":5,"id":6,"t":"dup"}`, `{"id":7,"id":8,"t":"dup2"}`, `{"id":9,"t":"e"}`, `{"id":10,"t":"f","b":true}`,
		`{"id":11,"t":"g"}`, `{"id":12,"zz":1,"t":"h"}`, `{"id":13,"zz":1,"t":"i"}`, `{"id":14,"t":"a\tb"}`, `{"id":15,"t":null}`,
		`{"zz":1}`, `{"id":16,"t":"j"}`,
	}
	for _, mode := range []string{"append", "upsert"} {
		s := &sink{spec: connector.SinkSpec{Mode: mode}}
		p := &plan{writable: map[string]bool{"id": true, "t": true, "b": true}, key: []string{"id"},
			copy: &copyPlan{conv: map[string]conv{"id": convText, "t": convText, "b": convText}}}
		sc := &rowScratch{arena: make([]byte, 0, 256)}
		for _, msg := range msgs {
			m := &broker.Delivery{Payload: []byte(msg)}
			got, gok := s.fastRowOp(p, m, sc)
			want, wok := s.fastRowOp(p, m, nil)
			if gok != wok || got.kind != want.kind || !slices.Equal(got.cols, want.cols) || got.colKey != want.colKey ||
				got.key != want.key || string(got.copy) != string(want.copy) {
				t.Fatalf("%s %s:\n with the batch's scratch %v %+v\n alone                    %v %+v", mode, msg, gok, got, wok, want)
			}
		}
	}
}

// TestRowByRow: a COPY of the sink's batch of short rows inserts row by
// row (the volatile WHERE clause), one of many rows or of long rows keeps
// PostgreSQL's multi-insert, and both write the same rows, in order, with
// their defaults, sequence values and row triggers.
func TestRowByRow(t *testing.T) {
	for _, c := range []struct {
		rows, size int
		want       bool
	}{
		{500, 500 * 150, true},      // the benchmark's batch: 437 slots
		{10000, 10000 * 150, false}, // many more rows than slots
		{2000, 2000 * 150, false},
		{1000, 1000 * 150, true},
		{500, 500 * 2000, false}, // 33 slots
		{33, 33 * 2000, true},    // every row a slot
		{1, 10, true},
		{0, 0, false},
	} {
		if got := rowByRow(c.rows, c.size) != ""; got != c.want {
			t.Errorf("rowByRow(%d rows, %d bytes) = %v, want %v", c.rows, c.size, got, c.want)
		}
	}
	db := newDB(t)
	exec(t, db, `CREATE TABLE hits (tbl text, id int)`,
		`CREATE FUNCTION hit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO hits VALUES (TG_TABLE_NAME, NEW.id); RETURN NULL; END $$`)
	for _, tb := range []string{"rb", "mi"} {
		exec(t, db, `CREATE TABLE `+tb+` (seq bigserial, id int, note text, d text DEFAULT 'dflt')`,
			`CREATE TRIGGER h AFTER INSERT ON `+tb+` FOR EACH ROW EXECUTE FUNCTION hit()`)
	}
	var batch []string
	for i := 0; i < 600; i++ {
		batch = append(batch, fmt.Sprintf(`{"id":%d,"note":"%s"}`, i, strings.Repeat("n", 100+i%40)))
	}
	ctx := context.Background()
	defer func() { copyMultiInsert = false }()
	for _, tb := range []string{"rb", "mi"} {
		copyMultiInsert = tb == "mi"
		w := directWorker(t, db, tb, "append", false, nil)
		items, _ := w.group(messages(batch, 0, false))
		if err := w.decode(ctx, items, nil); err != nil {
			t.Fatal(err)
		}
		var ops []*op
		for _, it := range items {
			for j := range it.ops {
				ops = append(ops, &it.ops[j])
			}
		}
		st := w.newCopyStep()
		w.appendCopyRun(st, runs(ops)[0])
		if got := strings.Contains(st.sql.String(), " WHERE "); got != !copyMultiInsert {
			t.Fatalf("%s: %q", tb, st.sql.String())
		}
		res, err := w.apply(ctx, messages(batch, 0, false), nil)
		if err != nil || res.applied != len(batch) {
			t.Fatalf("%s: %v", tb, err)
		}
		if c := w.s.copied.Load(); c != int64(len(batch)) {
			t.Fatalf("%s: COPY wrote %d rows, want %d", tb, c, len(batch))
		}
	}
	a, b := query(t, db, `SELECT seq, id, note, d FROM rb ORDER BY seq`), query(t, db, `SELECT seq, id, note, d FROM mi ORDER BY seq`)
	if !slices.Equal(a, b) || len(a) != len(batch) || !strings.HasPrefix(a[599], "600 | 599 | nnn") || !strings.HasSuffix(a[599], "| dflt") {
		t.Fatalf("rows\n row by row %q\n multi      %q", a[:2], b[:2])
	}
	if got := query(t, db, `SELECT tbl, count(*), count(DISTINCT id) FROM hits GROUP BY tbl ORDER BY tbl`); !slices.Equal(got, []string{"mi | 600 | 600", "rb | 600 | 600"}) {
		t.Fatalf("row triggers %q", got)
	}
}

// TestCopyReaderNotReusedAfterFailure: when the server ends the connection
// in the middle of a COPY, pgconn's CopyFrom returns while its goroutine
// that reads the data may still run. The worker must not hand that reader
// or its buffer to the next COPY (reusing them raced with that goroutine
// in a crash test under -race), and the next COPY on a new connection
// writes all of its rows.
func TestCopyReaderNotReusedAfterFailure(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE copy_fail (t text)`)
	w := directWorker(t, db, "copy_fail", "append", false, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Another transaction holds the table, so the COPY waits for its lock
	// while the client's goroutine fills the socket and blocks writing.
	locker, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	if _, err := locker.Exec(ctx, `BEGIN; LOCK TABLE copy_fail IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// pg_stat_activity is fixed for the length of a transaction: the
	// backend is looked for from a connection of its own.
	killer, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close(context.Background())
	killed := make(chan error, 1)
	go func() {
		killed <- func() error {
			for {
				var n int
				err := killer.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE query LIKE 'COPY public.copy_fail%' AND wait_event_type = 'Lock'`).Scan(&n)
				if err != nil || n > 0 {
					return err
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
	}()

	st := w.newCopyStep()
	st.sql.WriteString("COPY public.copy_fail (t) FROM STDIN")
	st.data = append(st.data, strings.Repeat("a line of text\n", 4<<20)...) // 60 MiB, more than the socket holds
	if err := w.runCopy(ctx, st); err == nil {
		t.Fatal("the COPY of a terminated backend succeeded")
	}
	if err := <-killed; err != nil {
		t.Fatalf("terminating the COPY: %v", err)
	}
	if w.copyRd != nil || w.copyBuf != nil {
		t.Fatal("the failed COPY's reader or buffer is kept for the next one")
	}
	if _, err := locker.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}

	w.conn.Close(context.Background())
	if w.conn, err = w.s.workerConn(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.conn.Close(context.Background())
	const rows = 5000
	for round := range 2 {
		st = w.newCopyStep()
		st.sql.WriteString("COPY public.copy_fail (t) FROM STDIN")
		for i := range rows {
			st.data = fmt.Appendf(st.data, "row %d\n", i)
		}
		if err := w.runCopy(ctx, st); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if w.copyRd == nil {
			t.Fatalf("round %d: the reader of a COPY that succeeded is not kept", round)
		}
		if got := count(t, db, `SELECT count(*) FROM copy_fail`); got != rows*(round+1) {
			t.Fatalf("round %d: %d rows, want %d", round, got, rows*(round+1))
		}
	}
}
