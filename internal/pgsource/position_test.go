package pgsource

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

// TestChunkRowsBeforeTheCommitAfterTheirMarker: a transaction deletes a
// row of a chunk after the chunk was read and commits right after the
// chunk's high watermark, so its commit record begins where the marker's
// record ends. In the queue the row's r comes before its d, and its
// (lsn, seq) is below the d's: a consumer ordering a key's events by
// position sees the same order as the queue's.
func TestChunkRowsBeforeTheCommitAfterTheirMarker(t *testing.T) {
	s := pgtest.Shared(t)
	b := openBroker(t, "")
	defer b.Close()
	ctx := context.Background()
	// Another record (a checkpoint's, autovacuum's) can land between the
	// marker and the commit; the case is tried until the commit follows
	// the marker at once.
	for attempt := 1; ; attempt++ {
		db := s.NewDatabase(t)
		s.Exec(t, db, "CREATE TABLE pos (id int PRIMARY KEY, v int NOT NULL); INSERT INTO pos SELECT g, 0 FROM generate_series(1, 10) g")
		doc := sourceDoc(s, db, fmt.Sprint("pos", attempt), connector.TableSpec{Table: "public.pos", Queue: "pos"})
		w, err := pgx.Connect(ctx, s.URL(db))
		if err != nil {
			t.Fatal(err)
		}
		var (
			once sync.Once
			tx   pgx.Tx
			high pglogrepl.LSN
			herr error
		)
		h := &hooks{
			beforeHigh: func(string) {
				once.Do(func() {
					if tx, herr = w.Begin(ctx); herr == nil {
						_, herr = tx.Exec(ctx, "DELETE FROM pos WHERE id = 3")
					}
				})
			},
			afterHigh: func(_ string, lsn pglogrepl.LSN) {
				if tx != nil && high == 0 {
					high = lsn
					herr = tx.Commit(ctx)
				}
			},
		}
		src := startSource(t, b, doc, "n1", h)
		evs := drain(t, b, "pos", fmt.Sprint("g", attempt), 11)
		if err := src.stop(t); err != nil {
			t.Fatal(err)
		}
		w.Close(ctx)
		if herr != nil {
			t.Fatal(herr)
		}
		var three []got
		for _, g := range evs {
			if g.msg.Partition == "3" {
				three = append(three, g)
			}
		}
		if len(three) != 2 || three[0].ev.Op != "r" || three[1].ev.Op != "d" {
			t.Fatalf("row 3: %d events, want its r then its d: %+v", len(three), three)
		}
		r, d := three[0].ev, three[1].ev
		rl, err1 := pglogrepl.ParseLSN(r.LSN)
		dl, err2 := pglogrepl.ParseLSN(d.LSN)
		if err1 != nil || err2 != nil {
			t.Fatalf("lsn %q, %q", r.LSN, d.LSN)
		}
		if dl != high {
			t.Logf("attempt %d: the delete committed at %s, not at the marker's end %s; again", attempt, dl, high)
			if attempt == 5 {
				t.Fatal("the commit never followed the high watermark at once")
			}
			continue
		}
		if rl > dl || rl == dl && r.Seq >= d.Seq {
			t.Fatalf("row 3: r at lsn %s seq %d, then d at lsn %s seq %d: the later event has the lower position", r.LSN, r.Seq, d.LSN, d.Seq)
		}
		return
	}
}
