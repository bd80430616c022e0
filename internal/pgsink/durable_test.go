package pgsink

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
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

// waitLeasesLapsed waits until no partition of queue is held for group
// under the lease of any of ps.
func waitLeasesLapsed(t *testing.T, b *broker.Broker, queue, group string, ps []*pending) {
	t.Helper()
	leases := map[string]bool{}
	for _, p := range ps {
		leases[p.resp.LeaseID] = true
	}
	waitFor(t, "the waiting batches' leases lapsed", 60*time.Second, func() error {
		parts, err := b.GroupPartitions(context.Background(), "default", group, queue, 0, 1000)
		if err != nil {
			return err
		}
		for _, p := range parts {
			for _, g := range p.Groups {
				if g.Group == group && g.Leased && leases[g.LeaseID] {
					return fmt.Errorf("partition %s still held by lease %s", p.Name, g.LeaseID)
				}
			}
		}
		return nil
	})
}

// barrierStops arms faultBeforeBarrier: before each barrier for which
// stop says so, the worker sends its pending batches on the returned
// channel and waits for resume. Call release once the sink was started:
// its cleanup lets a stopped worker go before the sink stops.
func barrierStops(t *testing.T, stop func(ps []*pending) bool) (stops <-chan []*pending, resume func(), release func()) {
	ch, res, quit := make(chan []*pending), make(chan struct{}), make(chan struct{})
	faultBeforeBarrier = func(ps []*pending) {
		if !stop(ps) {
			return
		}
		select {
		case ch <- ps:
			select {
			case <-res:
			case <-quit:
			}
		case <-quit:
		}
	}
	t.Cleanup(func() { faultBeforeBarrier = nil })
	return ch, func() { res <- struct{}{} }, func() { t.Cleanup(func() { close(quit) }) }
}

// nextStop waits for a worker stopped before a barrier.
func nextStop(t *testing.T, stops <-chan []*pending, what string) []*pending {
	t.Helper()
	select {
	case ps := <-stops:
		return ps
	case <-time.After(30 * time.Second):
		t.Fatalf("no barrier %s within 30 s", what)
		return nil
	}
}

func pendingMessages(ps []*pending) int {
	n := 0
	for _, p := range ps {
		n += len(p.resp.Delivered)
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
// At the end each message is in the table once and acked. With the
// server's synchronous_commit off, the barrier turns it on for itself.
func TestCrashBeforeBarrier(t *testing.T) {
	for _, sc := range []string{"on", "off"} {
		t.Run("synchronous_commit="+sc, func(t *testing.T) { crashBeforeBarrier(t, sc) })
	}
}

func crashBeforeBarrier(t *testing.T, syncCommit string) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	pg := pgtest.Private(t, pgtest.Options{Settings: map[string]string{
		"synchronous_commit": syncCommit, "wal_writer_delay": "10000ms", "bgwriter_lru_maxpages": "0"}})
	db := pg.URL(pg.NewDatabase(t))
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	b := openBroker(t)
	const n, crashes = 6000, 3
	pushNumbered(t, b, "nums", 16, 0, n)
	// A drawn number of barriers run, then the worker stops before the
	// next one with at least two batches pending while the test crashes
	// and restarts PostgreSQL.
	var left, skip atomic.Int32
	left.Store(crashes)
	skip.Store(int32(2 + rng.IntN(8)))
	stops, resume, release := barrierStops(t, func(ps []*pending) bool {
		if left.Load() == 0 || skip.Add(-1) >= 0 || len(ps) < 2 {
			return false
		}
		left.Add(-1)
		return true
	})
	// The worker waits after each commit, so that its pops stay ahead of
	// its writes and batches pile up behind a barrier: a worker that
	// writes faster than it pops (one round trip a batch, the race
	// detector slowing the pops) finds no next batch ready and makes each
	// batch a barrier alone.
	faultAfterCommit = func() bool { time.Sleep(15 * time.Millisecond); return false }
	t.Cleanup(func() { faultAfterCommit = nil })
	spec := sinkSpec("nums", "public.nums", "append")
	spec.Batch, spec.Workers, spec.LeaseSeconds = 20, 1, 30
	r := startSink(t, b, "nums", db, spec)
	release()
	lost := 0
	for i := 0; i < crashes; i++ {
		ps := nextStop(t, stops, "with two batches pending")
		visible := count(t, db, `SELECT count(*) FROM nums`)
		crashPostgres(t, pg, db)
		pg.Start(t)
		durable := count(t, db, `SELECT count(*) FROM nums`)
		acked := consumed(t, b, "pg-nums")
		t.Logf("crash %d: %d batches (%d messages) pending; rows %d before the crash, %d after; %d messages acked", i, len(ps), pendingMessages(ps), visible, durable, acked)
		if acked > int64(durable) {
			t.Fatalf("crash %d: %d messages acked, but only %d rows survived the crash", i, acked, durable)
		}
		if durable < visible {
			lost++
		}
		if visible-durable > pendingMessages(ps) {
			t.Fatalf("crash %d lost %d rows, more than the %d messages waiting for their barrier", i, visible-durable, pendingMessages(ps))
		}
		skip.Store(int32(2 + rng.IntN(8)))
		resume()
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

// sinkStoppedAtBarrier pushes n numbered messages over partitions into a
// new table nums and starts a sink with spec that stops at its first
// barrier with batches waiting: the database, the broker, the sink, the
// waiting batches and the function that lets the barrier go on.
func sinkStoppedAtBarrier(t *testing.T, n, partitions int, spec *connector.SinkSpec) (string, *broker.Broker, *running, []*pending, func()) {
	t.Helper()
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	b := openBroker(t)
	pushNumbered(t, b, "nums", partitions, 0, n)
	var once atomic.Bool
	stops, resume, release := barrierStops(t, func(ps []*pending) bool { return len(ps) > 0 && once.CompareAndSwap(false, true) })
	r := startSink(t, b, "nums", db, spec)
	release()
	return db, b, r, nextStop(t, stops, "with a batch waiting"), resume
}

// TestLeaseLostBeforeBarrier: the leases of batches waiting for their
// barrier run out (their renewals stopped, as when the broker cannot be
// reached) and the other worker is handed the messages again: it finds
// them committed and skips them, and the first worker's late ack changes
// nothing. Each message is in the table once; the batches that waited
// (and at most the popAheadShared+1 popped ahead) were delivered twice.
func TestLeaseLostBeforeBarrier(t *testing.T) {
	const n = 2000
	spec := sinkSpec("nums", "public.nums", "append")
	spec.Batch, spec.Workers, spec.LeaseSeconds = 50, 2, 5
	db, b, r, ps, resume := sinkStoppedAtBarrier(t, n, 8, spec)
	for _, p := range ps {
		p.lease.stop()
	}
	waiting := pendingMessages(ps)
	t.Logf("%d batches (%d messages) wait for their barrier; their leases are no longer renewed", len(ps), waiting)
	// The stopped worker's pop loop may have pops waiting when the leases
	// run out, and be handed up to popAheadShared batches of those
	// messages itself; it holds them (renewing their leases) until it is
	// resumed, and skips them then. So the other worker skips all but at
	// most that many batches first.
	waitFor(t, "the other worker skipped the waiting messages", 60*time.Second, func() error {
		if s := r.metrics.skipped.get(); s < float64(waiting-popAheadShared*spec.Batch) {
			return fmt.Errorf("skipped %v of %d", s, waiting)
		}
		return nil
	})
	// With one batch waiting the wait above holds at once: resumed before
	// its lease ran out, the worker's ack would still succeed and nothing
	// would be delivered again. Resume only once no waiting lease holds.
	waitLeasesLapsed(t, b, "nums", "pg-nums", ps)
	t.Logf("%v of %d skipped before the stopped worker resumed", r.metrics.skipped.get(), waiting)
	resume()
	waitFor(t, "every waiting message skipped", 60*time.Second, func() error {
		if s := r.metrics.skipped.get(); s < float64(waiting) {
			return fmt.Errorf("skipped %v of %d", s, waiting)
		}
		return nil
	})
	exactlyOnce(t, db, n)
	waitFor(t, "every message acked", 60*time.Second, func() error {
		if c := consumed(t, b, "pg-nums"); c != n {
			return fmt.Errorf("%d acked", c)
		}
		return nil
	})
	// The batches the stopped worker had popped ahead (one taken to see
	// that it was ready, popAheadShared more waiting in the pop loop) are
	// renewed from their pop, but a stop can catch one between its pop
	// and the start of its renewal: at most that many batches more may be
	// skipped.
	most := (popAheadShared + 1) * spec.Batch
	if s, d := r.metrics.skipped.get(), r.metrics.dlq.get(); s < float64(waiting) || s > float64(waiting+most) || d != 0 {
		t.Fatalf("skipped %v (want the %d that waited, and at most %d more), dead letters %v", s, waiting, most, d)
	}
}

// TestLeaseRenewedBeforeBarrier: batches that wait for their barrier
// longer than leaseSeconds (7 s, the lease 5 s), and the batches popped
// ahead meanwhile, keep their leases, so their ack goes through and
// nothing is delivered twice.
func TestLeaseRenewedBeforeBarrier(t *testing.T) {
	const n = 1000
	spec := sinkSpec("nums", "public.nums", "append")
	spec.Batch, spec.LeaseSeconds = 100, 5
	db, b, r, ps, resume := sinkStoppedAtBarrier(t, n, 4, spec)
	held := time.Now()
	time.Sleep(7 * time.Second) // longer than the lease
	t.Logf("%d batches (%d messages) waited %v for their barrier", len(ps), pendingMessages(ps), time.Since(held).Round(time.Millisecond))
	resume()
	exactlyOnce(t, db, n)
	waitFor(t, "every message acked", 60*time.Second, func() error {
		if c := consumed(t, b, "pg-nums"); c != n {
			return fmt.Errorf("%d acked", c)
		}
		return nil
	})
	if s := r.metrics.skipped.get(); s != 0 {
		t.Fatalf("%v messages delivered again: a lease ran out while its batch waited for the barrier", s)
	}
}

// TestOnlyAWriteIsABarrier: after a commit with synchronous_commit off,
// an immediate shutdown of PostgreSQL (which keeps unflushed WAL for 10 s
// here) loses the row when nothing followed, or a transaction that only
// took an xid (with synchronous_commit on), or a read; the sink's barrier,
// which writes, keeps it.
func TestOnlyAWriteIsABarrier(t *testing.T) {
	pg := pgtest.Private(t, pgtest.Options{Settings: map[string]string{
		"synchronous_commit": "off", "wal_writer_delay": "10000ms", "bgwriter_lru_maxpages": "0"}})
	db := pg.URL(pg.NewDatabase(t))
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	ctx := context.Background()
	env, _ := envFor(nil, "barrier", connFor(db), sinkSpec("x", "public.nums", "append"))
	env.Broker = &broker.Broker{}
	rn, err := New(env)
	if err != nil {
		t.Fatal(err)
	}
	sk := rn.(*sink)
	for _, c := range []struct {
		after string
		kept  bool
	}{
		{"", false},
		{"BEGIN; SET LOCAL synchronous_commit = on; SELECT pg_current_xact_id(); COMMIT", false},
		{"SELECT 1", false},
		{"barrier", true},
	} {
		conn, _, err := sk.connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		exec(t, db, "TRUNCATE nums", "CHECKPOINT")
		if _, err := conn.Exec(ctx, "BEGIN; "+asyncCommit+"; INSERT INTO nums VALUES (1, 'x'); COMMIT"); err != nil {
			t.Fatal(err)
		}
		switch c.after {
		case "":
		case "barrier":
			w := &worker{s: sk, conn: conn, stmts: map[string]string{}}
			msgs := []broker.Delivery{{Partition: "p", PartitionID: 1}}
			if err := w.barrier(ctx, []*pending{{resp: &broker.PopResponse{Delivered: msgs}, pc: conn.PgConn()}}); err != nil {
				t.Fatal(err)
			}
		default:
			if _, err := conn.Exec(ctx, c.after); err != nil {
				t.Fatal(err)
			}
		}
		conn.Close(ctx)
		crashPostgres(t, pg, db)
		pg.Start(t)
		if got := count(t, db, `SELECT count(*) FROM nums`); (got == 1) != c.kept {
			t.Fatalf("after %q: %d rows survived the crash, want kept=%v", c.after, got, c.kept)
		}
	}
}

// TestGroupsOpenOnABacklog: a worker alone, writing the full batches of a
// backlog behind one another, leaves a group open while the pop under way
// comes back in time (closesGroup's bet), so that most batches commit
// without waiting for a flush. Its answers come through a proxy that holds
// them back 10 ms, so that the pops (slower under -race than PostgreSQL's
// answers) come back first, as they do on a quiet machine. Over two
// partitions, both held by the batches waiting for their ack, the pop
// under way often cannot come back, and a lost bet stops the bets for
// betPause batches. Either way each message lands once.
func TestGroupsOpenOnABacklog(t *testing.T) {
	const n, batch = 20000, 100
	t.Run("backlog", func(t *testing.T) {
		// Groups close on their count, not on the age of their first
		// batch, which answers 10 ms late (and later on a loaded
		// machine) would reach after a few batches.
		defer func(d time.Duration) { maxPendingAge = d }(maxPendingAge)
		maxPendingAge = time.Minute
		for run := 1; ; run++ {
			s := groupsRun(t, n, batch, 32, 10*time.Millisecond)
			bets, lost := s.bets.Load(), s.betsLost.Load()
			if won := bets - lost; won >= int64(n/batch/4) {
				return
			}
			if run == 3 {
				t.Fatalf("in %d runs at most %d of %d bets won over %d batches: most batches waited for a flush", run, bets-lost, bets, n/batch)
			}
			t.Logf("run %d: %d of %d bets won; trying again", run, bets-lost, bets)
		}
	})
	t.Run("two partitions", func(t *testing.T) {
		s := groupsRun(t, n, batch, 2, 0)
		if lost, most := s.betsLost.Load(), int64(n/batch/betPause+1); lost > most {
			t.Fatalf("%d bets lost (of %d) over %d batches: want at most %d, one per %d batches after a lost one", lost, s.bets.Load(), n/batch, most, betPause)
		}
	})
}

// groupsRun sinks n messages over parts partitions in batches of batch
// with one worker, its answers delayed by delay (none: no proxy), checks
// that the table holds each once, and returns the sink for its counters.
func groupsRun(t *testing.T, n, batch, parts int, delay time.Duration) *sink {
	t.Helper()
	db := newDB(t)
	createNums(t, db, "append")
	b := openBroker(t)
	pushNumbered(t, b, "nums", parts, 0, n)
	spec := sinkSpec("nums", "public.nums", "append")
	spec.Batch = batch
	via := db
	if delay > 0 {
		_, via = newSlowProxy(t, db, delay)
	}
	r := startSink(t, b, "nums", via, spec)
	waitFor(t, "all applied", 120*time.Second, func() error {
		if a := r.metrics.applied.get(); a != float64(n) {
			return fmt.Errorf("applied %v", a)
		}
		return nil
	})
	r.stop()
	if got := query(t, db, `SELECT count(*), count(DISTINCT n), min(n), max(n) FROM nums`); got[0] != fmt.Sprintf("%d | %d | 0 | %d", n, n, n-1) {
		t.Fatalf("rows: %s", got[0])
	}
	s := r.sink
	t.Logf("%d partitions: %d pipelined, %d awaited; barriers %d full, %d aged, %d with no next batch, %d of their own; %d bets, %d lost",
		parts, s.pipelined.Load(), s.awaited.Load(), s.barrierFull.Load(), s.barrierAge.Load(), s.barrierIdle.Load(), s.barrierOwn.Load(), s.bets.Load(), s.betsLost.Load())
	return s
}
