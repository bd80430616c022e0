package pgsource

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

// TestCommittedButInvisibleBeforeChunk: a transaction whose commit is in
// the WAL (so the stream delivers it) but not yet visible to other
// sessions (it waits for a synchronous standby that never answers) when a
// chunk is read must not let the chunk's older copy of its row follow its
// update: the chunk is read again once the transaction is visible.
func TestCommittedButInvisibleBeforeChunk(t *testing.T) {
	s := pgtest.Private(t, pgtest.Options{})
	s.Exec(t, "postgres", "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT g, 0 FROM generate_series(1, 10) g; CREATE PUBLICATION mine FOR TABLE t")
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, "postgres", "invis", connector.TableSpec{Table: "public.t", Queue: "t"})
	*doc.Source.ManagePublication = false
	doc.Source.Publication = "mine"
	ctx := context.Background()
	var once atomic.Bool
	blocked := make(chan error, 1)
	h := &hooks{beforeLow: func(string) {
		if !once.CompareAndSwap(false, true) {
			return
		}
		// From now on a commit waits for a standby that does not exist:
		// logged and flushed, so the stream sends it, but still running
		// for every other session's snapshot.
		s.Exec(t, "postgres", "ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
		s.Exec(t, "postgres", "SELECT pg_reload_conf()")
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			t.Error(err)
			return
		}
		go func() {
			defer c.Close(context.Background())
			// The test server commits asynchronously; this one waits.
			_, err := c.Exec(ctx, "SET synchronous_commit = on; UPDATE t SET v = 1 WHERE id = 5")
			blocked <- err
		}()
		poll, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			t.Error(err)
			return
		}
		defer poll.Close(ctx)
		if err := waitFor(func() error {
			var n int
			if err := poll.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n); err != nil {
				return err
			}
			if n != 1 {
				return errString("the update is not waiting for the standby yet")
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}}
	src := startSource(t, b, doc, "n1", h)
	// The update reaches the queue while it is still invisible, and the
	// chunk, which cannot see it, is held back.
	if err := waitFor(func() error {
		if src.status.Get().Messages < 1 {
			return errString("nothing pushed yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if n := src.status.Get().Messages; n != 1 {
		t.Fatalf("%d messages pushed while the update is invisible, want only the update", n)
	}
	// Let it become visible: cancel the wait (the commit stands), and
	// stop waiting for standbys.
	s.Exec(t, "postgres", "ALTER SYSTEM RESET synchronous_standby_names")
	s.Exec(t, "postgres", "SELECT pg_reload_conf()")
	s.Exec(t, "postgres", "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
	<-blocked
	src.waitPhase(t, connector.PhaseStreaming)
	var five []got
	for _, g := range drain(t, b, "t", "g", 11) {
		if g.msg.Partition == "5" {
			five = append(five, g)
		} else if g.ev.Op != "r" {
			t.Fatalf("unexpected %s", g.msg.Data)
		}
	}
	if len(five) != 2 || five[0].ev.Op != "u" || five[1].ev.Op != "r" || string(five[1].ev.After["v"]) != "1" {
		for _, g := range five {
			t.Logf("row 5: %s", g.msg.Data)
		}
		t.Fatal("row 5 must be its update, then its copy with the update (never older after newer)")
	}
}
