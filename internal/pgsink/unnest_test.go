package pgsink

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestUnnestMatchesPopulate: upserts written from array literals (no
// staging table) give, row by row, what the populate path writes for the
// same messages (the values of TestCopyMatchesPopulate, each under a key
// of its own), then again when a second batch updates every row naming
// only some columns (the others keep their values), and the same outcomes
// and errors for refused values.
func TestUnnestMatchesPopulate(t *testing.T) {
	db := newDB(t)
	cols := strings.Replace(allTypes, "seq bigserial", "k int PRIMARY KEY", 1)
	exec(t, db, `CREATE TYPE mood AS ENUM ('sad', 'happy')`, `CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
		`CREATE TABLE via_copy `+cols, `CREATE TABLE via_populate `+cols)
	msgs := []string{
		`{"t":"a\"b\\c\td\ne\rf","vc":"x"}`, `{"t":"\\N","vc":"\\.","ch":"N"}`, `{"t":"NULL","vc":"","ch":"ab"}`,
		`{"t":"h\u00e9llo ✓ \ud83d\ude00 \/ \b\f","vc":"日本語"}`, `{"t":"it's {a,b} \"q\" \\\\ NULL","vc":"'"}`,
		`{"n":123456789012345678901234567890.123456789012,"n2":"12.345","i8":9223372036854775807,"i2":-32768}`,
		`{"t":1.50,"vc":true,"ch":false,"n":0.000,"n2":-0.5}`, `{"t":null,"j":null,"jb":null,"dom":null,"dflt":null}`,
		`{"jb":{"b":1,"a":"x\ty","a":[1,{"c":null}]},"j":"a\"\\\u0001b\n"}`, `{"j":12.50,"jb":12.50}`, `{"j":true,"jb":"s\\N"}`,
		`{"b":"yes","i4":"42","f4":0.1,"f8":1.7976931348623157}`,
		`{"u":"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11","d":"2024-02-29","tm":"13:45:00.123","ts":"2024-01-01T00:00:00","tz":"2024-01-01T00:00:00+02:00"}`,
		`{"iv":"1 day 2 hours","ip":"10.0.0.1/8","e":"happy","dom":3,"by":"\\x414243","r":"[1,5)"}`,
		` { "t" : "spaced" , "i4" : 7 } `, `{"t":"first","t":"second"}`, `{"ch":"  ","vc":"   "}`,
	}
	keyed := func(from int, ms []string) []string {
		out := make([]string, len(ms))
		for i, m := range ms {
			out[i] = strings.Replace(m, "{", fmt.Sprintf(`{"k":%d,`, from+i), 1)
		}
		return out
	}
	wc := directWorker(t, db, "via_copy", "upsert", false, nil)
	wp := directWorker(t, db, "via_populate", "upsert", true, nil)
	if !wc.unnesting() {
		t.Fatal("the table's upserts do not take unnest")
	}
	ctx := context.Background()
	compare := func() {
		t.Helper()
		a := query(t, db, `SELECT k, `+allCols+` FROM via_copy ORDER BY k`)
		b := query(t, db, `SELECT k, `+allCols+` FROM via_populate ORDER BY k`)
		if !slices.Equal(a, b) {
			t.Fatalf("tables differ:\n unnest   %q\n populate %q", a, b)
		}
	}
	apply := func(payloads []string, first int, apart bool) [][]string {
		return applyBoth(t, ctx, wc, wp, messages(payloads, first, apart))
	}
	apply(keyed(0, msgs), 0, false)
	if len(wc.ups.names) == 0 {
		t.Fatal("the upserts' arrays were not bound")
	}
	if c := wc.s.copied.Load(); c != int64(len(msgs)) {
		t.Fatalf("%d of %d rows written from arrays", c, len(msgs))
	}
	compare()
	// Every row again, naming t and i4 only, or vc only.
	var again []string
	for i := range msgs {
		if i%2 == 0 {
			again = append(again, fmt.Sprintf(`{"k":%d,"t":"again %d","i4":%d}`, i, i, i))
		} else {
			again = append(again, fmt.Sprintf(`{"k":%d,"vc":"v%d"}`, i, i))
		}
	}
	apply(again, len(msgs), false)
	compare()
	// refused values, each in a partition of its own, and one good one
	refused := keyed(1000, []string{`{"i4":"lots"}`, `{"t":"ok 1"}`, `{"dom":-1}`, `{"vc":"this string is longer than twenty"}`, `{"e":"angry"}`, `{"n2":"12345678901234"}`})
	outs := apply(refused, 2*len(msgs), true) // each in a partition of its own
	if n := strings.Count(strings.Join(outs[0], "\n"), " 3 "); n != 5 || !strings.Contains(outs[0][0], `invalid input syntax for type integer: "lots"`) {
		t.Fatalf("outcomes %q", outs[0])
	}
	compare()
}

// TestUnnestType: an interval with fields keeps a table's upserts off
// unnest: its input reads "1" as a minute for `interval minute` and as a
// second without the typmod, which an array (literal or parameter) is read
// without; the staging table's COPY reads it with the typmod, as populate
// does. Other typmods are applied by the cast after the input, as COPY
// applies them.
func TestUnnestType(t *testing.T) {
	for elem, want := range map[string]bool{
		"text": true, "bigint": true, "bpchar": true, "numeric(12,2)": true, "interval": true, "interval(3)": true,
		"timestamp(3) without time zone": true, "public.interval_like": true,
		"interval minute": false, "interval day to second(3)": false,
	} {
		if got := unnestType(elem); got != want {
			t.Errorf("unnestType(%q) = %v, want %v", elem, got, want)
		}
	}
	db := newDB(t)
	cols := `(k int PRIMARY KEY, im interval minute, iy interval year, n numeric(5,1))`
	exec(t, db, `CREATE TABLE iv_copy `+cols, `CREATE TABLE iv_populate `+cols)
	wc := directWorker(t, db, "iv_copy", "upsert", false, nil)
	wp := directWorker(t, db, "iv_populate", "upsert", true, nil)
	if wc.unnesting() {
		t.Fatal("a table with an interval with fields upserts through unnest")
	}
	ctx := context.Background()
	for _, w := range []*worker{wc, wp} {
		res, err := w.apply(ctx, messages([]string{`{"k":1,"im":"1","iy":"1","n":"1.25"}`, `{"k":2,"im":"90 seconds"}`}, 0, false), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(outcomes(res), ","); got != "0 2 ,1 2 " {
			t.Fatalf("%s: outcomes %q", w.s.table, got)
		}
	}
	a := query(t, db, `SELECT k, im, iy, n FROM iv_copy ORDER BY k`)
	b := query(t, db, `SELECT k, im, iy, n FROM iv_populate ORDER BY k`)
	if !slices.Equal(a, b) || a[0] != "1 | 00:01:00 | 1 year | 1.3" {
		t.Fatalf("staging %q, populate %q", a, b)
	}
}

// TestUpsertBoundEdges: upserts whose arrays are bound (prepared once per
// connection) write what populate writes: typmods applied as the input function with
// the typmod applies them (numeric and timestamp rounding, numeric
// overflow refused, char(n) trailing spaces cut and too long refused),
// NULLs, rows in message order (an omitted serial
// column numbers them), the last write of a key in a batch winning, and
// omitted columns left to their DEFAULT or their value. The second batch
// takes one round trip (the known offsets), the third a new connection.
func TestUpsertBoundEdges(t *testing.T) {
	db := newDB(t)
	cols := `(k int PRIMARY KEY, s bigserial, n numeric(5,2), ts timestamp(0), ch char(3), t text, d text DEFAULT 'dflt')`
	exec(t, db, `CREATE TABLE ub_copy `+cols, `CREATE TABLE ub_populate `+cols)
	wc := directWorker(t, db, "ub_copy", "upsert", false, nil)
	wp := directWorker(t, db, "ub_populate", "upsert", true, nil)
	ctx := context.Background()
	apply := func(payloads []string, first int, apart bool) {
		t.Helper()
		applyBoth(t, ctx, wc, wp, messages(payloads, first, apart))
		a := query(t, db, `SELECT k, s, n, ts, ch, t, d FROM ub_copy ORDER BY k`)
		b := query(t, db, `SELECT k, s, n, ts, ch, t, d FROM ub_populate ORDER BY k`)
		if !slices.Equal(a, b) {
			t.Fatalf("tables differ:\n unnest   %q\n populate %q", a, b)
		}
	}
	apply([]string{
		`{"k":3,"n":"1.005","ts":"2024-01-01 00:00:00.6","ch":"ab   ","t":"three"}`,
		`{"k":1,"n":null,"ts":null,"ch":null,"t":null}`,
		`{"k":2,"n":"-999.994","ts":"2024-02-29T23:59:59.4","ch":"xyz","t":"a\"b\\c'd,{e}"}`,
		`{"k":3,"n":"2","t":"three again"}`, // a repeated key: a run of its own, last wins
		`{"k":4,"n":"7"}`,
		`{"k":5,"t":"five"}`,
	}, 0, false)
	if len(wc.ups.names) == 0 {
		t.Fatal("no upsert statement was prepared")
	}
	if got := query(t, db, `SELECT k, s, n, ch, t, d FROM ub_copy ORDER BY s`); !slices.Equal(got, []string{
		"3 | 1 | 2.00 | ab  | three again | dflt", "1 | 2 | NULL | NULL | NULL | dflt",
		"2 | 3 | -999.99 | xyz | a\"b\\c'd,{e} | dflt", "4 | 5 | 7.00 | NULL | NULL | dflt",
		"5 | 6 | NULL | NULL | five | dflt"}) {
		t.Fatalf("rows %q", got)
	}
	// The known offsets: one round trip, bound statements run as prepared.
	trips := wc.s.oneTrip.Load()
	apply([]string{`{"k":1,"n":"3.5","d":"set"}`, `{"k":6,"t":"six","n":"0.125"}`}, 6, false)
	if wc.s.oneTrip.Load() == trips {
		t.Fatal("the second batch did not take one round trip")
	}
	// Refused values (each in a partition of its own): numeric overflow,
	// char(3) too long, beside good rows.
	apply([]string{`{"k":7,"n":"1000"}`, `{"k":8,"ch":"abcd"}`, `{"k":9,"ch":"ab  "}`}, 100, true)
	// A new connection: the statements are prepared on it again.
	wc.conn.Close(ctx)
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	wc.conn = conn
	apply([]string{`{"k":10,"t":"ten"}`, `{"k":2,"t":"two"}`}, 8, false)
	if wc.ups.pc != conn.PgConn() || len(wc.ups.names) == 0 {
		t.Fatal("the statements were not prepared on the new connection")
	}
}

// TestUpsertBoundConcurrentInsert: a key another transaction inserts
// while the sink upserts it is waited for and then updated (ON CONFLICT's
// guarantee, kept with bound arrays), not refused as a duplicate.
func TestUpsertBoundConcurrentInsert(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE ub_conc (k int PRIMARY KEY, t text, o text DEFAULT 'other')`)
	w := directWorker(t, db, "ub_conc", "upsert", false, nil)
	ctx := context.Background()
	if _, err := w.apply(ctx, messages([]string{`{"k":1,"t":"warm"}`}, 0, false), nil); err != nil {
		t.Fatal(err)
	}
	other, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, `BEGIN; INSERT INTO ub_conc (k, t, o) VALUES (5, 'theirs', 'kept')`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		res, err := w.apply(ctx, messages([]string{`{"k":4,"t":"four"}`, `{"k":5,"t":"ours"}`, `{"k":6,"t":"six"}`}, 1, false), nil)
		if err == nil && strings.Join(outcomes(res), ",") != "1 2 ,2 2 ,3 2 " {
			err = fmt.Errorf("outcomes %q", outcomes(res))
		}
		done <- err
	}()
	if err := testkit.CheckFor(10*time.Second, 5*time.Millisecond, func() error {
		if n := count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%ub_conc%'`); n == 0 {
			return fmt.Errorf("the sink does not wait for the other insert")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := query(t, db, `SELECT k, t, o FROM ub_conc ORDER BY k`); !slices.Equal(got, []string{"1 | warm | other", "4 | four | other", "5 | ours | kept", "6 | six | other"}) {
		t.Fatalf("rows %q", got)
	}
}

// applyBoth applies the same messages through the unnest worker wc and the
// populate worker wp and requires the same outcomes; it returns both.
func applyBoth(t *testing.T, ctx context.Context, wc, wp *worker, msgs []broker.Delivery) [][]string {
	t.Helper()
	var outs [][]string
	for _, w := range []*worker{wc, wp} {
		res, err := w.apply(ctx, msgs, nil)
		if err != nil {
			t.Fatalf("%s: %v", w.s.table, err)
		}
		outs = append(outs, outcomes(res))
	}
	if !slices.Equal(outs[0], outs[1]) {
		t.Fatalf("outcomes differ:\n unnest   %q\n populate %q", outs[0], outs[1])
	}
	return outs
}

// TestUnnestTextBinary: the arrays of text columns go in binary format,
// those of a domain over text, varchar and char in text, and every row
// comes out as the populate path writes it: NULLs, empty strings,
// non-ASCII, quotes, backslashes, braces, commas, tabs and newlines, the
// characters of \N and NULL; a domain's check still runs. Then each tricky
// field is bound both ways in one statement, which must read them as the
// same array.
func TestUnnestTextBinary(t *testing.T) {
	db := newDB(t)
	cols := `(k int PRIMARY KEY, t text, t2 text, dt tdom, vc varchar(10), ch char(3), n int, d date)`
	exec(t, db, `CREATE DOMAIN tdom AS text CHECK (VALUE <> 'bad')`,
		`CREATE TABLE tb_copy `+cols, `CREATE TABLE tb_populate `+cols)
	msgs := []string{
		`{"k":1,"t":"plain","t2":"","dt":"dom","vc":"v","ch":"c","n":1,"d":"2024-01-02"}`,
		`{"k":2,"t":null,"t2":null,"dt":null,"vc":null,"ch":null,"n":null,"d":null}`,
		`{"k":3,"t":"a\"b\\c\td\ne\rf","t2":"{a,b}","dt":"x,y","vc":"{}","ch":"\"","n":-3}`,
		`{"k":4,"t":"\\N","t2":"NULL","dt":"\\\\N","vc":"null","ch":"N"}`,
		`{"k":5,"t":"h\u00e9llo ✓ \ud83d\ude00 日本語","t2":"it's 'q'","dt":"é","vc":"日本語"}`,
		`{"k":6,"t":"  spaced  ","t2":"\\\\","dt":"\\","vc":"  ","ch":"  "}`,
		`{"k":7,"t":12.50,"t2":true,"dt":false,"n":7}`,
		`{"k":8,"t2":"only t2"}`,
		`{"k":9,"t":"","t2":"\"\"","dt":"","vc":"","ch":""}`,
	}
	wc := directWorker(t, db, "tb_copy", "upsert", false, nil)
	wp := directWorker(t, db, "tb_populate", "upsert", true, nil)
	if !wc.unnesting() {
		t.Fatal("the table's upserts do not take unnest")
	}
	for c, want := range map[string]bool{"t": true, "t2": true, "dt": false, "vc": false, "ch": false, "n": false, "d": false, "k": false} {
		if got := wc.plan.copy.binText[c]; got != want {
			t.Errorf("column %s: binary %v, want %v", c, got, want)
		}
	}
	ctx := context.Background()
	compare := func(rows int) {
		t.Helper()
		q := `SELECT k, t, t2, dt, vc, ch, n, d, t IS NULL, t2 IS NULL, dt IS NULL FROM %s ORDER BY k`
		a := query(t, db, fmt.Sprintf(q, "tb_copy"))
		b := query(t, db, fmt.Sprintf(q, "tb_populate"))
		if len(a) != rows || !slices.Equal(a, b) {
			t.Fatalf("tables differ:\n unnest   %q\n populate %q", a, b)
		}
	}
	res := applyBoth(t, ctx, wc, wp, messages(msgs, 0, false))
	if c := wc.s.copied.Load(); c != int64(len(msgs)) {
		t.Fatalf("%d of %d rows written from arrays (outcomes %q)", c, len(msgs), res[0])
	}
	compare(len(msgs))
	// Updates of every row, then a domain's refusal, in partitions apart.
	var again []string
	for i := range msgs {
		again = append(again, fmt.Sprintf(`{"k":%d,"t":"again, {%d} \"x\"","dt":"d%d"}`, i+1, i, i))
	}
	applyBoth(t, ctx, wc, wp, messages(again, len(msgs), false))
	compare(len(msgs))
	outs := applyBoth(t, ctx, wc, wp, messages([]string{`{"k":20,"t":"fine","dt":"bad"}`, `{"k":21,"t":"fine"}`}, 2*len(msgs), true))
	if !strings.Contains(outs[0][0], "tdom") || strings.Contains(outs[0][1], "tdom") {
		t.Fatalf("outcomes %q", outs[0])
	}
	compare(len(msgs) + 1)

	// Every field both ways, as one column of a run.
	fields := [][]byte{[]byte(`plain`), []byte(`\N`), []byte(``), []byte(`\\N`), []byte(`a"b\\c\td\ne\rf`),
		[]byte(`{a,b}`), []byte(`NULL`), []byte(`é ✓ 日本語`), []byte(`'`), []byte(` `), []byte(`\\`)}
	bin, ok := textArrayBinary(fields, 1, 0, len(fields))
	if !ok {
		t.Fatal("textArrayBinary refused the fields")
	}
	rr := wc.conn.PgConn().ExecParams(ctx, `SELECT $1::text[] IS NOT DISTINCT FROM $2::text[], cardinality($1::text[]), array_position($1::text[], NULL)`,
		[][]byte{bin, textArray(fields, 1, 0, len(fields))}, nil, []int16{1, 0}, nil).Read()
	if rr.Err != nil {
		t.Fatal(rr.Err)
	}
	if got := fmt.Sprintf("%s %s %s", rr.Rows[0][0], rr.Rows[0][1], rr.Rows[0][2]); got != "t 11 2" {
		t.Fatalf("binary against text: %s, want t 11 2", got)
	}
	// An escape copytext.go never writes keeps the column in text.
	if _, ok := textArrayBinary([][]byte{[]byte(`a\bc`)}, 1, 0, 1); ok {
		t.Fatal("textArrayBinary took an unknown escape")
	}
}
