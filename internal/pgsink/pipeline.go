package pgsink

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/queen-mq/queen/internal/broker"
)

// A worker pipelines its one-round-trip batches (known.go) on its
// connection: the next batch's statements (a simple query: BEGIN, the
// check, the COPY and its data, the offsets, COMMIT; or an upsert's bound
// statements up to their Sync, upsertbind.go) are written before the answer to
// the one before has been read, so the backend goes from one transaction
// to the next without waiting for the sink. At most two batches are
// unanswered at a time, and a batch's answer is read before anything else
// uses the connection (a barrier of its own, a batch done the careful way).
//
// Exactly once holds as for one batch: each transaction's check compares
// the progress rows it locks with the offsets the batches before it will
// have left, so a transaction whose partitions moved (a batch before it
// that failed, another node) fails before it writes. A failure leaves the
// transaction open and aborted, so every batch written after it fails at
// its BEGIN and its COPY data is dropped (PostgreSQL ignores copy messages
// outside a COPY); once their answers are read the transaction is rolled
// back and each failed batch is done again on its own, the careful way,
// in order. A batch joins the pending batches only once its COMMIT is
// confirmed, and is acked only after a barrier, as before.

// maxFlights is how many batches a worker keeps unanswered.
const maxFlights = 2

// noPipeline is for benchmarks: every batch waits for the answer to the
// one before, as before pipelining.
var noPipeline bool

// copyChunk is the size of the CopyData messages of a pipelined batch.
const copyChunk = 64 << 10

// flight is a batch whose transaction is written and whose answer is not
// read yet.
type flight struct {
	resp    *broker.PopResponse
	pre     *decodedBatch
	res     *result
	lease   *renewer
	pc      *pgconn.PgConn
	copied  int
	closing bool // its transaction writes the barrier row
	at      time.Time
	err     error // the write failed: the connection is closed
}

// send writes a decoded batch's transaction to the connection without
// waiting for its answer, when the batch takes one round trip with COPY
// (the offsets of its partitions known, every run COPY-able) and the
// connection needs nothing set up first. It returns false, having sent
// nothing, otherwise.
func (w *worker) send(ctx context.Context, resp *broker.PopResponse, pre *decodedBatch, lease *renewer) bool {
	if noPipeline || pre == nil || w.conn == nil || w.conn.IsClosed() || w.plan.copy == nil || (lease != nil && lease.lost()) {
		return false
	}
	pc := w.conn.PgConn()
	if w.prepared != pc || (!w.noStage && w.staged != pc) {
		return false // the first batch on a connection sets it up
	}
	if err := w.prepareCopy(ctx, pre.items); err != nil {
		return false
	}
	parts := pre.parts
	if !w.s.known.fill(parts) || !contiguous(parts) {
		return false
	}
	res := &result{items: pre.items}
	todo, err := w.classify(ctx, res, parts)
	rs := runs(todo)
	copied := 0
	for _, run := range rs {
		if run[0].copy != nil {
			copied += len(run)
		}
	}
	if err != nil || copied == 0 || !w.oneSend(rs) {
		for _, it := range pre.items {
			it.state = stPending
		}
		return false
	}
	applied := func(p *partWork, i int) bool { return p.items[i].state != stSkipped && i < p.stop }
	f := &flight{resp: resp, pre: pre, res: res, lease: lease, pc: pc, copied: copied, at: time.Now()}
	f.closing = w.closesGroup(w.s.spec.Workers == 1 && len(w.flights) > 0 && len(resp.Delivered) >= w.s.spec.Batch)
	if f.closing && faultBeforeBarrier != nil {
		if len(w.flights) > 0 {
			// The fault hook is to see every batch that waits for the
			// barrier answered and pending: this one goes on its own.
			for _, it := range pre.items {
				it.state = stPending
			}
			return false
		}
		faultBeforeBarrier(w.pending)
	}
	w.closing = f.closing
	st := w.leadStep(rs, parts, applied)
	w.closing = false
	f.err = w.write(ctx, pc, st)
	// What the batch leaves is what the next batches on these partitions
	// check; a failure forgets it again.
	w.s.known.learn(parts, applied)
	w.flights = append(w.flights, f)
	if len(w.flights) > 1 {
		w.s.pipelined.Add(1)
	}
	return true
}

// write sends a step's statements and its COPY data without reading.
// The messages are framed into the worker's own buffer, kept from batch to
// batch, and written to the connection in one call: what the connection's
// frontend would write, without its buffer growing from 1 KiB to the
// batch's size and being dropped again for every batch.
func (w *worker) write(ctx context.Context, pc *pgconn.PgConn, st *copyStep) error {
	b, err := appendStep(w.wire[:0], st)
	if err != nil {
		return err
	}
	if len(st.data) > 0 {
		for d := st.data; len(d) > 0; {
			n := min(len(d), copyChunk)
			b = append(appendMsgHead(b, 'd', n), d[:n]...)
			d = d[n:]
		}
		b = appendMsgHead(b, 'c', 0)
	}
	nc := pc.Conn()
	stop := context.AfterFunc(ctx, func() { nc.SetWriteDeadline(time.Now()) })
	_, err = nc.Write(b)
	if !stop() {
		nc.SetWriteDeadline(time.Time{})
	}
	if cap(b) <= maxWireKeep {
		w.wire = b[:0]
	} else {
		w.wire = nil // an outsized batch's buffer is not kept
	}
	if !st.borrowed {
		w.copyBuf = st.data[:0]
	}
	if err != nil {
		// Part of a message may be written: the connection is unusable.
		w.closeConn(ctx)
		return err
	}
	return nil
}

// maxWireKeep bounds the write buffer a worker keeps between batches.
const maxWireKeep = 4 << 20

// appendMsgHead appends a protocol message's type byte and length (of a
// body of n bytes) to b.
func appendMsgHead(b []byte, typ byte, n int) []byte {
	return binary.BigEndian.AppendUint32(append(b, typ), uint32(n+4))
}

func (w *worker) closeConn(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	w.conn.Close(cctx)
}

// answer reads one flight's answer: every message up to its
// ReadyForQuery, and the first error among them.
func (w *worker) answer(ctx context.Context, f *flight) error {
	if f.err != nil {
		return f.err
	}
	if f.pc.IsClosed() {
		return errors.New("the connection closed before the batch's answer")
	}
	var first error
	waited := false
	for {
		start := time.Now()
		msg, err := f.pc.ReceiveMessage(ctx)
		if err != nil {
			w.closeConn(ctx) // the batch's outcome is unknown
			return err
		}
		waited = waited || time.Since(start) >= readWaited
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			if first == nil {
				first = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.ReadyForQuery:
			w.answers.note(f.pc, time.Since(f.at), waited)
			return first
		}
	}
}

// answerTime is a moving estimate of how long a connection's answers take
// from the write of a batch to its ReadyForQuery.
type answerTime struct {
	pc *pgconn.PgConn
	d  time.Duration
}

// readWaited is how long a read takes at least when it waited for the
// server, not just took what was buffered.
const readWaited = 100 * time.Microsecond

// note adds one answer's time. An answer read without waiting was in
// before it was read: its time is only an upper bound, so it never raises
// the estimate (else each wait that ran to its end would raise the next
// one), and one in by the estimate lowers it a little: the estimate goes
// up with answers later than it and down with earlier ones.
func (a *answerTime) note(pc *pgconn.PgConn, d time.Duration, waited bool) {
	switch {
	case a.pc != pc:
		if waited {
			a.pc, a.d = pc, d
		} else {
			a.pc, a.d = nil, 0
		}
	case waited || d < a.d:
		a.d += (d - a.d) / 4
	default:
		a.d -= a.d / 8
	}
}

// due is when the answer to a flight written at at is to be expected, or
// false when its connection has no estimate yet.
func (a *answerTime) due(pc *pgconn.PgConn, at time.Time) (time.Time, bool) {
	if a.pc != pc || a.d <= 0 {
		return time.Time{}, false
	}
	return at.Add(a.d), true
}

// awaitPop waits, with a full batch in flight and no next batch ready,
// for the pop under way, until the oldest flight's answer is due (by the
// connection's recent answers) or the first pending batch is
// maxPendingAge old, whichever is first. Draining at once would leave the
// connection idle behind that answer if the pop came back just after:
// the pop loop starts the next pop only when the worker takes a batch,
// and a pop is a raft round. A batch short of the sink's batch size says
// the queue is drained: the pop under way may wait for messages, and the
// batches' acks (and their partitions' next messages) would wait with
// it. A worker of several does not wait: the others' connections keep
// PostgreSQL busy meanwhile, so its wait buys little and holds its acks
// back (docs/benchmarks.md). It says whether a batch is ready (w.ahead).
// It pops nothing further ahead: a worker held up keeps no more batches
// than before (TestLeaseLostBeforeBarrier).
func (w *worker) awaitPop(ctx context.Context) bool {
	if len(w.flights) == 0 || w.popsDone || w.pops == nil || w.s.spec.Workers > 1 {
		return false
	}
	f := w.flights[len(w.flights)-1]
	if len(f.resp.Delivered) < w.s.spec.Batch {
		return false
	}
	f = w.flights[0]
	until, ok := w.answers.due(f.pc, f.at)
	if !ok {
		return false
	}
	if len(w.pending) > 0 {
		if age := w.pending[0].at.Add(maxPendingAge); age.Before(until) {
			until = age
		}
	}
	wait := time.Until(until)
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case resp, ok := <-w.pops:
		if !w.take(resp, ok) {
			return false
		}
		w.s.awaited.Add(1)
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// collect reads the answers of the oldest flights until at most keep are
// unanswered, or of all of them once one failed; the committed ones join
// the pending batches and the failed ones are done again. It returns a
// coded or fatal error of a batch done again (the batches after it are
// handed back).
func (w *worker) collect(ctx context.Context, keep int) error {
	if len(w.flights) <= keep {
		return nil
	}
	rctx := ctx
	if ctx.Err() != nil {
		// Stopping: the answers of batches written are still worth reading.
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), barrierTimeout)
		defer cancel()
	}
	var fs []*flight
	var errs []error
	failed := false
	for len(w.flights) > keep || (failed && len(w.flights) > 0) {
		f := w.flights[0]
		w.flights = w.flights[1:]
		err := w.answer(rctx, f)
		fs, errs = append(fs, f), append(errs, err)
		failed = failed || err != nil
	}
	if failed && w.conn != nil && !w.conn.IsClosed() && w.conn.PgConn().TxStatus() != 'I' {
		if err := w.conn.PgConn().Exec(rctx, "ROLLBACK").Close(); err != nil {
			w.closeConn(ctx)
		}
	}
	// The committed ones first: pending batches are in commit order, and
	// every batch done again commits after them (a barrier covers only the
	// commits before its own).
	for i, f := range fs {
		if errs[i] == nil {
			w.landed(f)
		}
	}
	var stop error
	for i, f := range fs {
		if errs[i] == nil {
			continue
		}
		w.s.known.forget(f.pre.parts)
		w.s.redone.Add(1)
		if progressMoved(errs[i]) {
			w.s.moved.Add(1)
		}
		if stop != nil || ctx.Err() != nil {
			f.lease.stop()
			w.release(f.resp)
			continue
		}
		for _, it := range f.pre.items {
			it.state, it.errText = stPending, ""
		}
		if err := w.batchSync(ctx, f.resp, f.pre, f.lease); err != nil {
			w.release(f.resp)
			stop = err
		}
	}
	return stop
}

// landed adds a flight whose COMMIT is confirmed to the pending batches.
func (w *worker) landed(f *flight) {
	s := w.s
	settle(f.res, f.pre.parts)
	w.recycle(f.pre)
	s.copied.Add(int64(f.copied))
	s.populated.Add(int64(f.res.applied - f.copied))
	s.oneTrip.Add(1)
	if faultAfterCommit != nil && faultAfterCommit() {
		f.lease.stop()
		return // as if the node died between COMMIT and the ack
	}
	w.pending = append(w.pending, &pending{resp: f.resp, res: f.res, lease: f.lease, pc: f.pc, at: time.Now(), durable: f.closing})
}

// drain reads every flight's answer.
func (w *worker) drain(ctx context.Context) error {
	return w.collect(ctx, 0)
}
