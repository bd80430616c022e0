package pgsink

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/failpoint"
)

// A batch's transaction commits with synchronous_commit off: its COMMIT
// returns before its WAL is flushed, and the batch waits, pending, until a
// later commit on the same connection that does wait for the flush: a
// barrier. That commit's record comes after every pending commit's in the
// WAL, so its flush (and its wait for synchronous standbys) covers them
// all, and then they are acked. Most often the barrier is the last batch
// of a group itself: when, before its COMMIT, the worker finds maxPending
// batches pending, the first of them maxPendingAge old, or no next batch
// ready, that batch's transaction turns synchronous_commit back on and
// writes the barrier row. Otherwise (a batch written the slow way, a
// failure, a stop) a barrier is a transaction of its own. Either way a
// batch alone is acked after one flush, as when every batch flushed, and
// a busy worker pays one flush per maxPending batches.

const (
	// maxPending and maxPendingAge bound the batches that wait for one
	// barrier (their number, and the time since the first one committed).
	maxPending = 8
	// barrierTimeout bounds a barrier run after the sink was stopped.
	barrierTimeout = 5 * time.Second
)

// maxPendingAge is a variable for tests that hold batches back with a slow
// connection, where a 25 ms age would close every group after one batch.
var maxPendingAge = 25 * time.Millisecond

// fpDurable is the failpoint between a barrier and the ack of its batches.
const fpDurable = "sink-durable"

// asyncCommit is what every batch's transaction commits with: the
// worker's connections set it for their session (prepareProgress).
const asyncCommit = "SET synchronous_commit = off"

// pending is a committed batch whose ack waits for a barrier.
type pending struct {
	resp  *broker.PopResponse
	res   *result
	lease *renewer
	pc    *pgconn.PgConn // the connection it committed on
	at    time.Time      // when it committed
	// its commit was a barrier: it and the batches before it are durable
	durable bool
}

// due says whether the pending batches are to be acked now: the last one
// was a barrier, or there are maxPending of them, or the first is
// maxPendingAge old.
func (w *worker) due() bool {
	if syncEach {
		return true
	}
	n := len(w.pending)
	return n > 0 && (w.pending[n-1].durable || n >= maxPending || time.Since(w.pending[0].at) >= maxPendingAge)
}

// closesGroup says whether the batch about to commit is to be a barrier:
// the batches pending before it will be maxPending, or the first of them
// is maxPendingAge old, or no next batch is ready (the worker would wait
// after it, and its partitions cannot be popped again before the ack).
//
// full says the batch is a full one written behind another by a worker
// alone (pipeline.go): the queue has a backlog, and the pop under way
// most often comes back before the batch is answered. Closing the group
// then would make nearly every batch wait for its flush, so the group is
// left open on that bet (openBet). next settles the bet: a next batch in
// time keeps the group open; none (few partitions, all of them held by
// the batches waiting for their ack) costs a barrier of its own, and the
// next betPause batches that find no next batch ready close their group
// as before.
func (w *worker) closesGroup(full bool) bool {
	if syncEach {
		return false
	}
	n, first := w.open()
	switch {
	case n+1 >= maxPending:
		w.s.barrierFull.Add(1)
	case n > 0 && time.Since(first) >= maxPendingAge:
		w.s.barrierAge.Add(1)
	case !w.ready():
		if full && w.noBets == 0 {
			w.openBet = true
			w.s.bets.Add(1)
			return false
		}
		w.noBets = max(w.noBets-1, 0)
		w.s.barrierIdle.Add(1)
	default:
		return false
	}
	w.openBet = false
	return true
}

// betPause is how many of the batches that find no next batch ready a
// worker closes at once after a bet that one would be (closesGroup) was
// lost.
const betPause = 32

// open counts the batches committed or in flight since the last barrier,
// and says when the first of them was.
func (w *worker) open() (n int, first time.Time) {
	count := func(at time.Time, barrier bool) {
		if n == 0 {
			first = at
		}
		n++
		if barrier {
			n = 0
		}
	}
	for _, p := range w.pending {
		count(p.at, p.durable)
	}
	for _, f := range w.flights {
		count(f.at, f.closing)
	}
	return n, first
}

// ready says whether a next batch is popped, taking it from the pop loop
// if it waits there.
func (w *worker) ready() bool {
	if w.ahead != nil {
		return true
	}
	if w.popsDone || w.pops == nil {
		return false
	}
	select {
	case resp, ok := <-w.pops:
		return w.take(resp, ok)
	default:
		return false
	}
}

// take keeps a batch received from the pop loop as the next one (ok false:
// the loop ended) and says whether there is one.
func (w *worker) take(resp *broker.PopResponse, ok bool) bool {
	if !ok {
		w.popsDone = true
		return false
	}
	w.ahead = resp
	return true
}

// next is the next popped batch. When none is ready and batches wait for
// their ack, it first makes them durable and acks them: the worker is about
// to wait, and their partitions cannot be popped again before the ack. With
// a batch in flight it first waits a little for the pop under way
// (awaitPop): the answer it would drain for is not in yet either.
func (w *worker) next(ctx context.Context) (*broker.PopResponse, bool) {
	if (len(w.pending) > 0 || len(w.flights) > 0) && !w.ready() && !w.awaitPop(ctx) {
		if w.openBet {
			w.s.betsLost.Add(1)
			w.noBets = betPause
		}
		w.openBet = false
		if err := w.drain(ctx); err != nil {
			w.failed = err
			return nil, false
		}
		w.settle(ctx)
	}
	w.openBet = false // a next batch is ready: the bet, if any, is won
	if resp := w.ahead; resp != nil {
		w.ahead = nil
		return resp, true
	}
	if w.popsDone {
		return nil, false
	}
	resp, ok := <-w.pops
	if !ok {
		w.popsDone = true
	}
	return resp, ok
}

// settle runs one barrier for the pending batches (none when the last
// one's commit was a barrier), then hands them to the acks. When the
// barrier fails their commits may be gone with the server
// (a crash loses commits not yet flushed), so they are handed back
// unacked: what PostgreSQL kept of them is skipped when they return, what
// it lost is written again.
func (w *worker) settle(ctx context.Context) {
	if len(w.pending) == 0 {
		return
	}
	if len(w.flights) > 0 && !syncEach && !w.pending[len(w.pending)-1].durable {
		// The barrier needs the connection: the batches in flight are
		// answered first (and join the pending ones).
		if err := w.drain(ctx); err != nil && w.failed == nil {
			w.failed = err
		}
		if len(w.pending) == 0 {
			return
		}
	}
	ps := w.pending
	w.pending = nil
	bctx := ctx
	if ctx.Err() != nil {
		// Stopping: the batches committed are still worth acking.
		var cancel context.CancelFunc
		bctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), barrierTimeout)
		defer cancel()
	}
	last := ps[len(ps)-1]
	durable := last.durable
	for _, p := range ps {
		durable = durable && p.pc == last.pc
	}
	var err error
	if !syncEach && !durable {
		if faultBeforeBarrier != nil {
			faultBeforeBarrier(ps)
		}
		err = w.barrier(bctx, ps)
	}
	for _, p := range ps {
		p.lease.stop()
	}
	if err != nil {
		s := w.s
		s.env.Metrics.Errors.Add(1)
		s.log.Warn("sink could not make its last commits durable; it hands those batches back unacked, and what PostgreSQL kept of them is skipped when they return", "batches", len(ps), "err", err)
		for _, p := range ps {
			w.release(p.resp)
		}
		return
	}
	failpoint.Hit(fpDurable)
	w.acks <- ps
}

// barrier commits a transaction of its own that writes the barrier row of
// the last pending batch (see barrierRow).
func (w *worker) barrier(ctx context.Context, ps []*pending) error {
	w.s.barrierOwn.Add(1)
	if w.conn == nil || w.conn.IsClosed() {
		return errors.New("the connection the batches committed on is closed")
	}
	pc := w.conn.PgConn()
	for _, p := range ps {
		if p.pc != pc {
			return errors.New("a batch committed on another connection")
		}
	}
	m := ps[len(ps)-1].resp.Delivered[0]
	if err := w.prepareProgress(ctx); err != nil {
		return err
	}
	b := &pgconn.Batch{}
	b.ExecParams("BEGIN", nil, nil, nil, nil)
	b.ExecPrepared(stmtBarrier, [][]byte{[]byte(w.s.name), barrierRow(m.PartitionID, m.Partition), []byte(w.durableCommit)}, nil, nil)
	b.ExecParams("COMMIT", nil, nil, nil, nil)
	if err := execBatch(ctx, pc, b); err != nil {
		if !pc.IsClosed() {
			if rerr := pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").Close(); rerr != nil {
				w.conn.Close(context.WithoutCancel(ctx))
			}
		}
		return err
	}
	return nil
}

// barrierRow names the progress row a barrier writes again, unchanged: one
// of a partition whose lease the worker holds, so no one else waits for
// it. A transaction must write to be a barrier: PostgreSQL flushes at
// commit only for one that wrote WAL, so one that only takes an xid
// (SELECT pg_current_xact_id()) commits without a flush.
func barrierRow(pid uint64, partition string) []byte {
	row, _ := json.Marshal([]any{pid, partition})
	return row
}

// commitBarrier is the SQL that makes a batch's own transaction a barrier
// before its COMMIT, for a simple query.
func (w *worker) commitBarrier(p *partWork) string {
	return "EXECUTE " + stmtBarrier + "(" + w.nameLit + ", " + quoteLiteral(string(barrierRow(p.pid, p.name))) + ", " + quoteLiteral(w.durableCommit) + ")"
}

// syncEach is for benchmarks: every batch commits with the connection's
// synchronous_commit and is acked on its own without a barrier, as the
// sink did before barriers.
var syncEach bool

// faultBeforeBarrier is a fault hook for tests, called with the pending
// batches before each barrier (a transaction of its own, or before the
// final round trip of a batch that is one).
var faultBeforeBarrier func(ps []*pending)
