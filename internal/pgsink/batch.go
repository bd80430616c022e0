package pgsink

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// Outcomes of a message in a batch.
const (
	stPending = iota
	stSkipped // at or below its partition's recorded offset: already applied
	stApplied
	stRefused // the table refused it (or the mode could not read it)
	stLater   // after a refused message of its partition: not tried
)

type item struct {
	m       *broker.Delivery
	ops     []op
	decErr  error // a refusal found before the database
	state   int
	errText string
}

type partWork struct {
	pid   uint64
	name  string
	items []*item // offset order
	last  int64   // the recorded offset, -1 for none
	stop  int     // index of the first item the fast path must not write
	// items is a piece of the batch's items that group still fills
	inItems bool
}

// result is what a committed batch did.
type result struct {
	items                     []*item
	applied, skipped, refused int
}

// apply writes one batch in one transaction and returns each message's
// outcome. An error means nothing was committed (or the commit's outcome
// is unknown): the caller retries a transient one.
//
// The common case takes one round trip when the sink knows the partitions'
// offsets (known.go), else two: BEGIN with the progress rows made and
// locked, then every run's statement, the new offsets and COMMIT. When the
// known offsets turn out moved, the batch is done again the two-trip way.
// When PostgreSQL refuses a value, the transaction is rolled back and done
// again one message at a time under savepoints, to find the messages it
// refuses.
//
// pre, when not nil, is the batch already grouped and decoded.
func (w *worker) apply(ctx context.Context, msgs []broker.Delivery, pre *decodedBatch) (*result, error) {
	var items []*item
	var parts []*partWork
	if pre != nil {
		items, parts = pre.items, pre.parts
	} else {
		items, parts = w.group(msgs)
		if err := w.decode(ctx, items, parts); err != nil {
			return nil, err
		}
	}
	if err := w.prepareCopy(ctx, items); err != nil {
		return nil, err
	}
	res, err := w.applyFast(ctx, items, parts, true)
	if errors.Is(err, errMoved) {
		w.s.moved.Add(1)
		for _, it := range items {
			it.state, it.errText = stPending, ""
		}
		res, err = w.applyFast(ctx, items, parts, false)
	}
	if !errors.Is(err, errRefused) {
		return res, err
	}
	for _, it := range items {
		it.state, it.errText = stPending, ""
	}
	return w.applySlow(ctx, items, parts)
}

// errRefused says the fast path met a data error and rolled back.
var errRefused = errors.New("a message was refused")

// classify marks what each partition's recorded offset already covers as
// skipped, stops each partition at its first message the mode cannot read,
// and returns the ops to write, in order.
func (w *worker) classify(ctx context.Context, res *result, parts []*partWork) ([]*op, error) {
	n := 0
	for _, p := range parts {
		n += len(p.items)
	}
	todo := make([]*op, 0, n) // most messages are one op
	for _, p := range parts {
		first := true
		p.stop = len(p.items)
		for i, it := range p.items {
			if int64(it.m.Offset) <= p.last {
				it.state = stSkipped
				res.skipped++
				continue
			}
			if first && p.last >= 0 && int64(it.m.Offset) > p.last+1 {
				if err := w.checkGap(ctx, p, it.m.Offset); err != nil {
					return nil, err
				}
			}
			first = false
			if it.decErr != nil && p.stop == len(p.items) {
				p.stop = i
			}
			if i < p.stop {
				for j := range it.ops {
					todo = append(todo, &it.ops[j])
				}
			}
		}
	}
	return todo, nil
}

// settle marks the outcome of every message not skipped once the writes
// before each partition's stop are known to be applied.
func settle(res *result, parts []*partWork) {
	for _, p := range parts {
		for i, it := range p.items {
			switch {
			case it.state == stSkipped:
			case i < p.stop:
				it.state = stApplied
				res.applied++
			case i == p.stop && it.decErr != nil:
				it.state, it.errText = stRefused, it.decErr.Error()
				res.refused++
			default:
				it.state = stLater
			}
		}
	}
}

func (w *worker) applyFast(ctx context.Context, items []*item, parts []*partWork, tryKnown bool) (*result, error) {
	pc := w.conn.PgConn()
	rollback := func() {
		if !pc.IsClosed() {
			if err := pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").Close(); err != nil {
				w.conn.Close(context.WithoutCancel(ctx))
			}
		}
	}
	if err := w.prepareProgress(ctx); err != nil {
		return nil, err
	}
	res, todo, lead, err := w.startFast(ctx, items, parts, tryKnown, rollback)
	if err != nil {
		return nil, err
	}
	applied := func(p *partWork, i int) bool { return p.items[i].state != stSkipped && i < p.stop }
	w.closing = w.closesGroup(false)
	if w.closing && faultBeforeBarrier != nil {
		faultBeforeBarrier(w.pending)
	}
	copied, err := w.writeFast(ctx, runs(todo), parts, applied, lead)
	w.flushed, w.closing = w.closing && err == nil, false
	if err != nil {
		rollback()
		w.s.known.forget(parts)
		switch {
		case lead && progressMoved(err):
			return nil, errMoved
		case dataError(err):
			return nil, errRefused
		}
		return nil, err
	}
	settle(res, parts)
	w.s.known.learn(parts, applied)
	w.s.copied.Add(int64(copied))
	w.s.populated.Add(int64(res.applied - copied))
	if lead {
		w.s.oneTrip.Add(1)
	}
	return res, nil
}

// startFast classifies the batch against its partitions' offsets. With
// tryKnown, and when the sink knows every partition's offset, nothing is
// sent yet and lead is true: the write's one round trip begins the
// transaction and checks the offsets (known.go). Otherwise it begins the
// transaction, makes sure the progress rows exist, locks and reads them.
func (w *worker) startFast(ctx context.Context, items []*item, parts []*partWork, tryKnown bool, rollback func()) (res *result, todo []*op, lead bool, err error) {
	if tryKnown && w.s.known.fill(parts) && contiguous(parts) {
		res = &result{items: items}
		if todo, err = w.classify(ctx, res, parts); err != nil {
			return nil, nil, false, err
		}
		if w.oneSend(runs(todo)) {
			return res, todo, true, nil
		}
		for _, it := range items {
			it.state = stPending
		}
	}
	b := &pgconn.Batch{}
	b.ExecParams("BEGIN", nil, nil, nil, nil)
	w.queueLock(b, parts)
	results, err := w.conn.PgConn().ExecBatch(ctx, b).ReadAll()
	if err == nil {
		err = firstErr(results)
	}
	if err == nil {
		err = readLast(results[len(results)-1], parts)
	}
	if err != nil {
		rollback()
		return nil, nil, false, err
	}
	res = &result{items: items}
	if todo, err = w.classify(ctx, res, parts); err != nil {
		rollback()
		return nil, nil, false, err
	}
	return res, todo, false, nil
}

// contiguous says whether each partition's first message past its offset
// is the next one: a gap needs the offset read in the transaction before
// it is taken for a retention gap.
func contiguous(parts []*partWork) bool {
	for _, p := range parts {
		for _, it := range p.items {
			if int64(it.m.Offset) > p.last {
				if int64(it.m.Offset) != p.last+1 {
					return false
				}
				break
			}
		}
	}
	return true
}

// oneSend says whether writeFast sends the runs in one round trip.
func (w *worker) oneSend(rs [][]*op) bool {
	copied, copyRuns := 0, 0
	for _, run := range rs {
		if run[0].copy != nil {
			copied += len(run)
			copyRuns++
		}
	}
	switch {
	case copied == 0:
		return true
	case w.staging(copyRuns):
		return copyRuns == len(rs)
	}
	return len(rs) == 1
}

// writeFast writes the runs, moves the offsets and commits, in as few
// round trips as it can: one pipelined batch when every run takes the
// populate path; else the COPY's simple query carries the statements after
// it and the COMMIT. It returns the rows written by COPY.
//
// With lead (only when oneSend), the one round trip also begins the
// transaction and checks the known offsets.
func (w *worker) writeFast(ctx context.Context, rs [][]*op, parts []*partWork, applied func(p *partWork, i int) bool, lead bool) (int, error) {
	pc := w.conn.PgConn()
	copied, copyRuns := 0, 0
	for _, run := range rs {
		if run[0].copy != nil {
			copied += len(run)
			copyRuns++
		}
	}
	if copied == 0 {
		b := &pgconn.Batch{}
		if lead {
			w.queueLead(b, parts, applied) // the offsets move here
		}
		for _, run := range rs {
			w.queueRun(b, run)
		}
		if !lead {
			w.queueMove(b, parts, applied)
		}
		w.queueCommit(b, parts)
		return 0, execBatch(ctx, pc, b)
	}
	if lead {
		return copied, w.runStep(ctx, w.leadStep(rs, parts, applied))
	}
	finish := func(st *copyStep) { w.finishStep(st, parts, applied) }
	if w.unnesting() {
		b := &pgconn.Batch{}
		for _, run := range rs {
			if run[0].copy == nil {
				w.queueRun(b, run)
				continue
			}
			w.queueUnnest(ctx, b, run)
		}
		w.queueMove(b, parts, applied)
		w.queueCommit(b, parts)
		return copied, execBatch(ctx, pc, b)
	}
	if w.staging(copyRuns) {
		st := w.newCopyStep()
		inserts := w.stageRuns(st, rs)
		if len(inserts) == len(rs) {
			for i := range rs {
				st.sql.WriteString("; " + inserts[i])
			}
			finish(st)
			return copied, w.runCopy(ctx, st)
		}
		if err := w.runCopy(ctx, st); err != nil {
			return 0, err
		}
		b := &pgconn.Batch{}
		for i, run := range rs {
			if q, ok := inserts[i]; ok {
				b.ExecParams(q, nil, nil, nil, nil)
			} else {
				w.queueRun(b, run)
			}
		}
		w.queueMove(b, parts, applied)
		w.queueCommit(b, parts)
		return copied, execBatch(ctx, pc, b)
	}
	// append without a staging table: the runs in order, each COPY run a
	// simple query of its own, the statements between them pipelined.
	b, queued := &pgconn.Batch{}, 0
	for i, run := range rs {
		if run[0].copy == nil {
			w.queueRun(b, run)
			queued++
			continue
		}
		if queued > 0 {
			if err := execBatch(ctx, pc, b); err != nil {
				return 0, err
			}
			b, queued = &pgconn.Batch{}, 0
		}
		st := w.newCopyStep()
		w.appendCopyRun(st, run)
		if i == len(rs)-1 {
			finish(st)
			return copied, w.runCopy(ctx, st)
		}
		if err := w.runCopy(ctx, st); err != nil {
			return 0, err
		}
	}
	w.queueMove(b, parts, applied)
	w.queueCommit(b, parts)
	return copied, execBatch(ctx, pc, b)
}

// unnesting says whether upserts skip the staging table (unnest.go).
func (w *worker) unnesting() bool {
	return w.s.spec.Mode == connector.ModeUpsert && w.plan.copy != nil && w.plan.copy.unnest
}

// staging says whether a batch's COPY runs go through the staging table:
// upserts, and appends of several COPY runs (one simple query can carry
// only one COPY).
func (w *worker) staging(copyRuns int) bool {
	return w.s.spec.Mode == connector.ModeUpsert || (copyRuns > 1 && w.staged == w.conn.PgConn())
}

// leadStep is the one simple query, with its COPY data, of a batch whose
// partitions' offsets are known and whose runs all take COPY (oneSend):
// the advance (known.go), the rows, the barrier row when the batch closes
// its group; the message is one implicit transaction, committed at its
// end.
func (w *worker) leadStep(rs [][]*op, parts []*partWork, applied func(p *partWork, i int) bool) *copyStep {
	if st := w.boundLead(rs, parts, applied); st != nil {
		return st
	}
	copyRuns := 0
	for _, run := range rs {
		if run[0].copy != nil {
			copyRuns++
		}
	}
	st := w.newCopyStep()
	st.sql.WriteString(w.leadSQL(parts, applied))
	if w.staging(copyRuns) {
		inserts := w.stageRuns(st, rs)
		for i := range rs {
			st.sql.WriteString("; " + inserts[i])
		}
	} else {
		w.appendCopyRun(st, rs[0])
	}
	if w.closing {
		st.sql.WriteString("; " + w.commitBarrier(parts[0]))
	}
	return st
}

// finishStep ends a simple query that carries a batch's last COPY: the new
// offsets, the barrier row when the batch closes its group, COMMIT.
func (w *worker) finishStep(st *copyStep, parts []*partWork, applied func(p *partWork, i int) bool) {
	if move := w.moveSQL(parts, applied); move != "" {
		st.sql.WriteString("; " + move)
	}
	if w.closing {
		st.sql.WriteString("; " + w.commitBarrier(parts[0]))
	}
	st.sql.WriteString("; COMMIT")
}

// queueCommit adds the COMMIT, after the barrier row when the batch closes
// its group (durable.go).
func (w *worker) queueCommit(b *pgconn.Batch, parts []*partWork) {
	if w.closing {
		b.ExecPrepared(stmtBarrier, [][]byte{[]byte(w.s.name), barrierRow(parts[0].pid, parts[0].name), []byte(w.durableCommit)}, nil, nil)
	}
	b.ExecParams("COMMIT", nil, nil, nil, nil)
}

func execBatch(ctx context.Context, pc *pgconn.PgConn, b *pgconn.Batch) error {
	results, err := pc.ExecBatch(ctx, b).ReadAll()
	if err == nil {
		err = firstErr(results)
	}
	return err
}

func firstErr(results []*pgconn.Result) error {
	for _, r := range results {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// applySlow writes the batch one message at a time, each under a
// savepoint: a message PostgreSQL refuses stops its partition there.
func (w *worker) applySlow(ctx context.Context, items []*item, parts []*partWork) (*result, error) {
	conn := w.conn
	// Deferred constraints are checked per statement here, so the one
	// message that breaks one is found under its savepoint, not at COMMIT.
	if _, err := conn.Exec(ctx, "BEGIN; SET CONSTRAINTS ALL IMMEDIATE"); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok && !conn.IsClosed() {
			if _, err := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
				conn.Close(context.WithoutCancel(ctx))
			}
		}
	}()
	if err := w.lockProgress(ctx, parts); err != nil {
		return nil, err
	}
	res := &result{items: items}
	if _, err := w.classify(ctx, res, parts); err != nil {
		return nil, err
	}
	for _, p := range parts {
		for i, it := range p.items {
			if it.state == stSkipped || i >= p.stop {
				continue
			}
			if err := w.applyOne(ctx, it); err != nil {
				if !dataError(err) {
					return nil, err
				}
				it.state, it.errText = stRefused, errorText(err)
				res.refused++
				for _, later := range p.items[i+1:] {
					later.state = stLater
				}
				p.stop = -1 // settled here
				break
			}
			it.state = stApplied
			res.applied++
		}
		if p.stop >= 0 {
			for i, it := range p.items {
				if it.state != stPending {
					continue
				}
				if i == p.stop && it.decErr != nil {
					it.state, it.errText = stRefused, it.decErr.Error()
					res.refused++
				} else {
					it.state = stLater
				}
			}
		}
	}
	if err := w.moveProgress(ctx, parts); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		w.s.known.forget(parts)
		return nil, err
	}
	ok = true
	w.s.known.learn(parts, func(p *partWork, i int) bool { return p.items[i].state == stApplied })
	w.s.populated.Add(int64(res.applied))
	return res, nil
}

// applyOne writes one message's ops under a savepoint of its own.
func (w *worker) applyOne(ctx context.Context, it *item) error {
	if _, err := w.conn.Exec(ctx, "SAVEPOINT queen_msg"); err != nil {
		return err
	}
	for j := range it.ops {
		if err := w.execRun(ctx, []*op{&it.ops[j]}); err != nil {
			if dataError(err) {
				if _, rerr := w.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT queen_msg"); rerr != nil {
					return rerr
				}
			}
			return err
		}
	}
	_, err := w.conn.Exec(ctx, "RELEASE SAVEPOINT queen_msg")
	return err
}
