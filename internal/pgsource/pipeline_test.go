package pgsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestStreamReadWhileCommitting: while the broker commits a bundle the
// source reads the stream on and has the next bundles ready, at most
// queueBundles of them; nothing is confirmed to PostgreSQL before its
// commit; and when that commit fails, the bundles read ahead are dropped
// and read again by the next run, so every change arrives once.
func TestStreamReadWhileCommitting(t *testing.T) {
	s, db := ordersSource(t)
	s.Exec(t, db, "CREATE TABLE pipe (id int PRIMARY KEY)")
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "pipe", connector.TableSpec{Table: "public.pipe", Queue: "pipe"})
	doc.Source.Snapshot = "never"
	doc.Source.MaxBundleMessages = 10

	blocked, release := make(chan struct{}), make(chan struct{})
	var handed, first atomic.Int32
	h := &hooks{
		handed: func(n int, _ *pointer) {
			if n > 0 {
				handed.Add(1)
			}
		},
		beforeCommit: func(n int, _ *pointer) error {
			if n == 0 || first.Add(1) != 1 {
				return nil
			}
			close(blocked)
			<-release
			return errCrash
		},
	}
	src := startSource(t, b, doc, "n1", h)
	src.waitPhase(t, connector.PhaseStreaming)
	start, _, err := b.KVGet(context.Background(), "default", connector.PointerKey("pipe"))
	if err != nil {
		t.Fatal(err)
	}
	s.Exec(t, db, "INSERT INTO pipe VALUES (1)")
	select {
	case <-blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the first bundle never reached the broker")
	}
	for i := 0; i < 4; i++ {
		s.Exec(t, db, fmt.Sprintf("INSERT INTO pipe SELECT g FROM generate_series(%d, %d) g", 2+10*i, 11+10*i))
	}
	// While the first commit hangs, bundles after it are read and handed.
	if err := testkit.CheckFor(30*time.Second, 10*time.Millisecond, func() error {
		if n := handed.Load(); n < 1+queueBundles {
			return fmt.Errorf("%d bundles handed to the committer", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := handed.Load(); n > 1+queueBundles {
		t.Fatalf("%d bundles handed while one commits; the queue holds %d", n, queueBundles)
	}
	// Nothing of them is confirmed: the slot is where the pointer was.
	var p pointer
	if err := json.Unmarshal(start.Value, &p); err != nil {
		t.Fatal(err)
	}
	c := s.Connect(t, db)
	var confirmed string
	if err := c.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", src.src.slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if lsn, err := pglogrepl.ParseLSN(confirmed); err != nil || lsn > pglogrepl.LSN(p.FlushLSN) {
		t.Fatalf("slot confirmed %s (%v) while the pointer says %s", confirmed, err, pglogrepl.LSN(p.FlushLSN))
	}
	close(release)
	select {
	case err := <-src.done:
		close(src.done)
		if !errors.Is(err, errCrash) {
			t.Fatalf("first run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the run did not stop at the failed commit")
	}
	startSource(t, b, doc, "n1", nil)
	evs := drain(t, b, "pipe", "g", 41)
	seen := map[string]bool{}
	for _, g := range evs {
		if seen[g.msg.Partition] {
			t.Fatalf("row %s twice", g.msg.Partition)
		}
		seen[g.msg.Partition] = true
	}
	if len(seen) != 41 {
		t.Fatalf("%d rows, want 41", len(seen))
	}
}
