package pgsource

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/connector"
)

// TestLargeTransactionInPieces: a 20,000-row transaction is pushed in
// pieces of maxBundleMessages; the source crashes before one piece
// commits and after another, and after the restarts the queue holds every
// row exactly once, each with its seq inside the transaction.
func TestLargeTransactionInPieces(t *testing.T) {
	const rows = 20000
	s, db := ordersSource(t)
	s.Exec(t, db, "CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL)")
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "split", connector.TableSpec{Table: "public.big", Queue: "big"})
	doc.Source.Snapshot = "never"
	doc.Source.MaxBundleMessages = 1000

	var pieces []int
	var seqs []int
	var fired atomic.Bool
	record := &hooks{beforeCommit: func(n int, p *pointer) error {
		if n > 0 {
			pieces = append(pieces, n)
			seqs = append(seqs, p.Seq)
		}
		if len(pieces) == 7 {
			fired.Store(true)
			return errCrash
		}
		return nil
	}}
	src := startSource(t, b, doc, "n1", record)
	src.waitPhase(t, connector.PhaseStreaming)
	s.Exec(t, db, fmt.Sprintf("INSERT INTO big SELECT g, repeat('v', 150) FROM generate_series(1, %d) g", rows))
	if err := <-src.done; !errors.Is(err, errCrash) {
		t.Fatalf("first run: %v", err)
	}
	close(src.done)
	for i, n := range pieces {
		if n > 1000 {
			t.Fatalf("piece %d holds %d messages, more than maxBundleMessages", i, n)
		}
		if seqs[i] != 1000*(i+1) {
			t.Fatalf("piece %d: pointer seq %d, want %d", i, seqs[i], 1000*(i+1))
		}
	}
	// The second run crashes after a piece committed, before PostgreSQL
	// heard of it.
	var count atomic.Int32
	src = startSource(t, b, doc, "n1", &hooks{afterCommit: func(n int, p *pointer) error {
		if count.Add(1) == 5 {
			if p.Seq != 11000 {
				return fmt.Errorf("second run's 5th piece ends at seq %d, want 11000", p.Seq)
			}
			return errCrash
		}
		return nil
	}})
	select {
	case err := <-src.done:
		close(src.done)
		if !errors.Is(err, errCrash) {
			t.Fatalf("second run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the second run did not crash")
	}
	startSource(t, b, doc, "n1", nil)
	evs := drain(t, b, "big", "g", rows)
	seen := map[int]bool{}
	lsn := evs[0].ev.LSN
	for _, g := range evs {
		if g.ev.Op != "c" || g.ev.LSN != lsn {
			t.Fatalf("event %s", g.msg.Data)
		}
		if seen[g.ev.Seq] {
			t.Fatalf("seq %d twice", g.ev.Seq)
		}
		seen[g.ev.Seq] = true
		if want := fmt.Sprint(g.ev.Seq + 1); g.msg.Partition != want {
			t.Fatalf("seq %d in partition %s, want %s", g.ev.Seq, g.msg.Partition, want)
		}
	}
}
