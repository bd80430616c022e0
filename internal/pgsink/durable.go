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
// returns before its WAL is flushed, and the batch waits, pending, for a
// durability barrier before it is acked. A barrier is a transaction that
// writes one row and commits with the connection's own synchronous_commit
// (on when that is off): its commit record comes after every pending
// commit's in the WAL, so its flush (and its wait for synchronous
// standbys) covers them all. One barrier makes up to maxPending batches
// durable, and runs as soon as the worker has no next batch ready, so a
// batch's ack waits for one flush, as it did when every batch flushed.

const (
	// maxPending and maxPendingAge bound the batches that wait for one
	// barrier (their number, and the time since the first one committed).
	maxPending    = 8
	maxPendingAge = 25 * time.Millisecond
	// barrierTimeout bounds a barrier run after the sink was stopped.
	barrierTimeout = 5 * time.Second
)

// fpDurable is the failpoint between a barrier and the ack of its batches.
const fpDurable = "sink-durable"

// asyncCommit is the first statement of every batch's transaction.
const asyncCommit = "SET LOCAL synchronous_commit = off"

// syncCommit makes the barrier's commit wait for its flush even where the
// role or server sets synchronous_commit off, and returns that setting.
const syncCommit = `SELECT s, set_config('synchronous_commit', CASE WHEN s = 'off' THEN 'on' ELSE s END, true)
	FROM current_setting('synchronous_commit') AS s`

// pending is a committed batch whose ack waits for a barrier.
type pending struct {
	resp  *broker.PopResponse
	res   *result
	lease *renewer
	pc    *pgconn.PgConn // the connection it committed on
	at    time.Time      // when it committed
}

// due says whether the pending batches must be made durable now, though
// a next batch may be ready.
func (w *worker) due() bool {
	if syncEach {
		return true
	}
	return len(w.pending) >= maxPending || (len(w.pending) > 0 && time.Since(w.pending[0].at) >= maxPendingAge)
}

// next is the next popped batch. When none is ready and batches wait for
// their ack, it first makes them durable and acks them: the worker is about
// to wait, and their partitions cannot be popped again before the ack.
func (w *worker) next(ctx context.Context, pops <-chan *broker.PopResponse) (*broker.PopResponse, bool) {
	if len(w.pending) > 0 {
		select {
		case resp, ok := <-pops:
			return resp, ok
		default:
		}
		w.settle(ctx)
	}
	resp, ok := <-pops
	return resp, ok
}

// settle runs one barrier for the pending batches, then hands them to the
// acks. When the barrier fails their commits may be gone with the server
// (a crash loses commits not yet flushed), so they are handed back
// unacked: what PostgreSQL kept of them is skipped when they return, what
// it lost is written again.
func (w *worker) settle(ctx context.Context) {
	if len(w.pending) == 0 {
		return
	}
	ps := w.pending
	w.pending = nil
	if faultBeforeBarrier != nil {
		faultBeforeBarrier(ps)
	}
	bctx := ctx
	if ctx.Err() != nil {
		// Stopping: the batches committed are still worth acking.
		var cancel context.CancelFunc
		bctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), barrierTimeout)
		defer cancel()
	}
	var err error
	if !syncEach {
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

// barrier commits a transaction that writes the progress row of the last
// pending batch's first partition again, unchanged, with the connection's
// synchronous_commit. A transaction that writes nothing (one that only
// takes an xid) commits without a flush, so it would be no barrier.
func (w *worker) barrier(ctx context.Context, ps []*pending) error {
	if w.conn == nil || w.conn.IsClosed() {
		return errors.New("the connection the batches committed on is closed")
	}
	pc := w.conn.PgConn()
	for _, p := range ps {
		if p.pc != pc {
			return errors.New("a batch committed on another connection")
		}
	}
	m := ps[len(ps)-1].resp.Messages[0]
	row, err := json.Marshal([]any{m.PartitionID, m.Partition})
	if err != nil {
		return err
	}
	if err := w.prepareProgress(ctx); err != nil {
		return err
	}
	b := &pgconn.Batch{}
	b.ExecParams("BEGIN", nil, nil, nil, nil)
	b.ExecParams(syncCommit, nil, nil, nil, nil)
	b.ExecPrepared(stmtBarrier, [][]byte{[]byte(w.s.name), row}, nil, nil)
	b.ExecParams("COMMIT", nil, nil, nil, nil)
	results, err := pc.ExecBatch(ctx, b).ReadAll()
	if err == nil {
		err = firstErr(results)
	}
	if err != nil {
		if !pc.IsClosed() {
			if rerr := pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").Close(); rerr != nil {
				w.conn.Close(context.WithoutCancel(ctx))
			}
		}
		return err
	}
	if r := results[1]; len(r.Rows) == 1 && string(r.Rows[0][0]) == "off" && w.s.syncOffLogged.CompareAndSwap(false, true) {
		w.s.log.Info("synchronous_commit is off for the sink's role or server; the sink's barriers commit with synchronous_commit on, so a batch is acked only once it is on disk")
	}
	return nil
}

// syncEach is for benchmarks: every batch commits with the connection's
// synchronous_commit and is acked on its own without a barrier, as the
// sink did before barriers.
var syncEach bool

// faultBeforeBarrier is a fault hook for tests, called with the pending
// batches before each barrier.
var faultBeforeBarrier func(ps []*pending)
