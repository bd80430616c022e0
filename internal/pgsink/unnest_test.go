package pgsink

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
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
		var outs [][]string
		for _, w := range []*worker{wc, wp} {
			res, err := w.apply(ctx, messages(payloads, first, apart), nil)
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
	apply(keyed(0, msgs), 0, false)
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
