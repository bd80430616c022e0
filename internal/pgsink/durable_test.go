package pgsink

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/pgtest"
)

// consumed is the group's count of messages acked as done.
func consumed(t testing.TB, b *broker.Broker, group string) int64 {
	t.Helper()
	gs, err := b.Groups(context.Background(), "default", group)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, g := range gs {
		n += g.Consumed
	}
	return n
}

// TestCrashBeforeBarrier: PostgreSQL is stopped in an immediate shutdown
// while batches committed without a flush wait for their barrier, three
// times, each after a few barriers went through. The server keeps unflushed WAL in memory for up to 10 s
// (wal_writer_delay), so each crash loses the last of those commits. The
// sink hands the batches back, writes what was lost again once the server
// is back, and at every crash the messages acked so far are no more than
// the rows that survived it: an ack never comes before its row is durable.
// At the end each message is in the table once and acked.
func TestCrashBeforeBarrier(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	pg := pgtest.Private(t, pgtest.Options{Settings: map[string]string{
		"synchronous_commit": "on", "wal_writer_delay": "10000ms", "bgwriter_lru_maxpages": "0"}})
	db := pg.URL(pg.NewDatabase(t))
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	b := openBroker(t)
	const n, crashes = 6000, 3
	pushNumbered(t, b, "nums", 16, 0, n)
	// The hook lets a drawn number of barriers run, then stops the worker
	// before the next one with at least two batches pending, and waits for
	// the test to crash and restart PostgreSQL.
	type stop struct{ pending, messages int }
	stops, resume, quit := make(chan stop), make(chan struct{}), make(chan struct{})
	var left, skip atomic.Int32
	left.Store(crashes)
	skip.Store(int32(2 + rng.IntN(8)))
	faultBeforeBarrier = func(ps []*pending) {
		if left.Load() == 0 || skip.Add(-1) >= 0 || len(ps) < 2 {
			return
		}
		left.Add(-1)
		msgs := 0
		for _, p := range ps {
			msgs += len(p.resp.Messages)
		}
		select {
		case stops <- stop{len(ps), msgs}:
			select {
			case <-resume:
			case <-quit:
			}
		case <-quit:
		}
	}
	t.Cleanup(func() { faultBeforeBarrier = nil })
	spec := sinkSpec("nums", "public.nums", "append")
	spec.Batch, spec.Workers, spec.LeaseSeconds = 20, 1, 30
	r := startSink(t, b, "nums", db, spec)
	t.Cleanup(func() { close(quit) }) // before the sink stops
	lost := 0
	for i := 0; i < crashes; i++ {
		var st stop
		select {
		case st = <-stops:
		case <-time.After(60 * time.Second):
			t.Fatalf("crash %d: no barrier with two batches pending within 60 s", i)
		}
		visible := count(t, db, `SELECT count(*) FROM nums`)
		crashPostgres(t, pg, db)
		pg.Start(t)
		durable := count(t, db, `SELECT count(*) FROM nums`)
		acked := consumed(t, b, "pg-nums")
		t.Logf("crash %d: %d batches (%d messages) pending; rows %d before the crash, %d after; %d messages acked", i, st.pending, st.messages, visible, durable, acked)
		if acked > int64(durable) {
			t.Fatalf("crash %d: %d messages acked, but only %d rows survived the crash", i, acked, durable)
		}
		if durable < visible {
			lost++
		}
		if visible-durable > st.messages {
			t.Fatalf("crash %d lost %d rows, more than the %d messages waiting for their barrier", i, visible-durable, st.messages)
		}
		skip.Store(int32(2 + rng.IntN(8)))
		resume <- struct{}{}
	}
	if lost == 0 {
		t.Fatalf("no crash lost a commit: the test did not test anything")
	}
	exactlyOnce(t, db, n)
	waitFor(t, "every message acked", 60*time.Second, func() error {
		if c := consumed(t, b, "pg-nums"); c != n {
			return fmt.Errorf("%d acked", c)
		}
		return nil
	})
	if r.metrics.dlq.get() != 0 || r.metrics.errors.get() < crashes {
		t.Fatalf("dlq %v errors %v: want no dead letter and the crashes counted", r.metrics.dlq.get(), r.metrics.errors.get())
	}
}
