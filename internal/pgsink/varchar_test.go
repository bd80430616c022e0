package pgsink

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// TestTrailingSpacesBeyondLength: a varchar(n) or char(n) value whose only
// excess over n is trailing spaces is cut to n, as a plain INSERT of that
// text does (SQL's rule for assignment), on every write path: COPY
// (append), the array literals of an upsert (unnest), the staging table,
// and jsonb_populate_recordset (both modes). A value with anything else
// beyond n, or a bit(n) value of another length, is refused on every path
// with the error the INSERT gives; each goes alone in its batch, so the
// fast path itself must refuse it (an explicit cast of the array literal
// to varchar(3)[] would cut it to size instead).
func TestTrailingSpacesBeyondLength(t *testing.T) {
	db := newDB(t)
	const cols = `(k int PRIMARY KEY, vc varchar(3), ch char(3), d vc3, bt bit(3), vb varbit(3))`
	exec(t, db, `CREATE DOMAIN vc3 AS varchar(3)`, `CREATE TABLE plain `+cols)
	good := []string{
		`{"k":1,"vc":"abc  ","ch":"xy   ","d":"def ","bt":"101","vb":"11"}`,
		`{"k":2,"vc":"日本語 ","ch":"é    "}`,
		`{"k":3,"vc":"ab\u0020\u0020\u0020","ch":"   "}`,
	}
	bad := []string{
		`{"k":4,"vc":"abcd","ch":"x"}`,    // d beyond 3
		`{"k":5,"vc":"ab","ch":"abc \t"}`, // a tab is not a space
		`{"k":6,"d":"abc x"}`,             // the domain's varchar(3)
	}
	// What a plain INSERT of the same text does.
	exec(t, db, `INSERT INTO plain (k, vc, ch, d, bt, vb) VALUES (1, 'abc  ', 'xy   ', 'def ', '101', '11'), (2, '日本語 ', 'é    ', NULL, NULL, NULL), (3, 'ab   ', '   ', NULL, NULL, NULL)`)
	want := query(t, db, `SELECT k, vc, length(vc), ch, octet_length(ch), d, bt, vb FROM plain ORDER BY k`)
	ctx := context.Background()
	type path struct {
		name, mode string
		populate   bool
		check      func(w *worker) bool
	}
	paths := []path{
		{"append COPY", "append", false, func(w *worker) bool { return w.s.copied.Load() == 3 }},
		{"append populate", "append", true, func(w *worker) bool { return w.s.populated.Load() == 3 }},
		{"upsert unnest", "upsert", false, func(w *worker) bool { return w.unnesting() && w.s.copied.Load() == 3 }},
		{"upsert staged", "upsert", false, func(w *worker) bool { return !w.unnesting() && w.s.copied.Load() == 3 }},
		{"upsert populate", "upsert", true, func(w *worker) bool { return w.s.populated.Load() == 3 }},
	}
	for i, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			table := fmt.Sprintf("t%d", i) // a sink, and progress rows, of its own
			exec(t, db, `CREATE TABLE `+table+` `+cols)
			w := directWorker(t, db, table, p.mode, p.populate, nil)
			if p.name == "upsert staged" {
				w.plan.copy.unnest = false
			}
			// the values cut to n, in one batch: the path itself writes them
			res, err := w.apply(ctx, messages(good, 0, true), nil)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range outcomes(res) {
				if o[2] != '2' {
					t.Fatalf("message %s: outcome %q", good[i], o)
				}
			}
			if !p.check(w) {
				t.Fatalf("not the %s path: copied %d, populated %d", p.name, w.s.copied.Load(), w.s.populated.Load())
			}
			// the values refused, each alone in a batch (one refused
			// value sends its whole batch the slow way)
			wantOut := []string{
				"0 3 value too long for type character varying(3) [SQLSTATE 22001]",
				"0 3 value too long for type character(3) [SQLSTATE 22001]",
				"0 3 value too long for type character varying(3) [SQLSTATE 22001]",
				"0 3 bit string length 4 does not match type bit(3) [SQLSTATE 22026]",
				"0 3 bit string too long for type bit varying(3) [SQLSTATE 22001]",
				"0 3 bit string length 2 does not match type bit(3) [SQLSTATE 22026]",
			}
			for i, m := range bad {
				bm := messages([]string{m}, 0, true)
				bm[0].PartitionID = uint64(200 + i)
				bm[0].Partition = fmt.Sprintf("p%d", bm[0].PartitionID)
				res, err = w.apply(ctx, bm, nil)
				if err != nil {
					t.Fatal(err)
				}
				if out := outcomes(res); len(out) != 1 || out[0] != wantOut[i] {
					t.Fatalf("message %s: outcome %q, want %q", m, out, wantOut[i])
				}
			}
			got := query(t, db, `SELECT k, vc, length(vc), ch, octet_length(ch), d, bt, vb FROM `+table+` ORDER BY k`)
			if !slices.Equal(got, want) {
				t.Fatalf("rows\n got  %q\n want %q", got, want)
			}
		})
	}
}
