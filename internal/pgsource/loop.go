package pgsource

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/connector"
)

// loop reads the stream until ctx ends or something fails, handing
// complete bundles to a committer that commits them in order while the
// stream is read on.
func (r *run) loop(ctx context.Context) error {
	lctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	// The committer outlives ctx by the last bundle's push when stopping
	// (the pointer's ifVersion keeps it harmless if another node took
	// over meanwhile).
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.c = newCommitter(r)
	r.c.start(cctx, stop)
	r.st.synced = &r.c.synced
	r.st.busy = r.c.pending
	err := r.read(lctx)
	// Whatever ends the run, a commit under way finishes (within a
	// bound) rather than leave its outcome unknown to the next run.
	t := time.AfterFunc(5*time.Second, cancel)
	defer t.Stop()
	if ferr := r.c.failure(); ferr != nil {
		r.c.abandon()
		return ferr
	}
	if err != nil && ctx.Err() == nil {
		r.c.abandon()
		if ferr := r.c.failure(); ferr != nil {
			return ferr
		}
		return err
	}
	// Stopping: push what was read.
	if r.dirty && !r.cur.open && !r.broken {
		if herr := r.flush(cctx); herr != nil {
			r.s.log.Warn("could not push the last bundle while stopping; the next owner reads it again", "err", herr)
		}
	}
	r.c.close()
	if ferr := r.c.failure(); ferr != nil && !errors.Is(ferr, context.Canceled) {
		r.s.log.Warn("could not push the last bundles while stopping; the next owner reads them again", "err", ferr)
	}
	return nil
}

// read reads and decodes the stream, building bundles. The node's CPU
// slot is held over a batch of messages: taken for the first, kept while
// the next one is already received, given back before anything that may
// wait (the stream, the snapshot's queries, handing a bundle over).
func (r *run) read(ctx context.Context) error {
	defer r.cpuRelease()
	r.st.beforeWait = r.cpuRelease
	defer func() { r.st.beforeWait = nil }()
	for {
		if r.snap.wants() {
			r.cpuRelease()
			if err := r.snap.step(ctx); err != nil {
				return err
			}
		}
		data, _, err := r.st.next(ctx, r.waitTime())
		if err != nil {
			return err
		}
		if data == nil {
			r.cpuRelease()
			if err := r.idle(ctx); err != nil {
				return err
			}
			continue
		}
		if err := r.cpuHold(ctx); err != nil {
			return err
		}
		if err := r.handle(ctx, data); err != nil {
			return err
		}
		if r.dirty && !r.cur.open && r.handable() {
			if err := r.flush(ctx); err != nil {
				return err
			}
		}
	}
}

// handable reports whether the pending bundle should go to the
// committer now: at once when the committer is idle, else once lingerMs
// passed and no other bundle waits (while one commits, the next grows
// rather than queue up small).
func (r *run) handable() bool {
	return r.c.idle() || r.c.inflight.Load() <= 1 && !time.Now().Before(r.deadline)
}

// waitTime is how long the stream may stay silent before idle runs.
func (r *run) waitTime() time.Duration {
	if r.dirty && !r.cur.open {
		if r.c.inflight.Load() > 1 {
			// Look again soon: the queue moves as bundles commit.
			return 5 * time.Millisecond
		}
		return max(time.Until(r.deadline), time.Millisecond)
	}
	now := time.Now()
	due := r.lastData.Add(r.s.heartbeat).Sub(now)
	if hb := r.lastHB.Add(r.s.heartbeat).Sub(now); hb > due {
		due = hb
	}
	if d, ok := r.snap.due(); ok && d < due {
		due = d
	}
	return max(min(due, statusInterval), 10*time.Millisecond)
}

// idle flushes a lingering bundle, and writes a heartbeat when the tables
// were quiet for heartbeatSeconds.
func (r *run) idle(ctx context.Context) error {
	if r.dirty && !r.cur.open {
		if r.handable() {
			return r.flush(ctx)
		}
		return nil
	}
	now := time.Now()
	if now.Sub(r.lastData) >= r.s.heartbeat && now.Sub(r.lastHB) >= r.s.heartbeat {
		r.lastHB = now
		if _, err := r.q.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, '', true)", r.hbPrefix()); err != nil {
			return fmt.Errorf("write a heartbeat into the WAL: %w", err)
		}
		r.slotLag(ctx)
	}
	return nil
}

func (r *run) hbPrefix() string { return "queen:" + r.s.slot + ":hb" }

// slotLag reports how much WAL the slot holds back.
func (r *run) slotLag(ctx context.Context) {
	r.lastLag = time.Now()
	var lag *int64
	err := r.q.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1", r.s.slot).Scan(&lag)
	if err != nil || lag == nil {
		return
	}
	r.s.env.Metrics.SourceSlotLagBytes.Set(float64(*lag))
	v := *lag
	r.s.env.Status.Update(func(st *connector.Status) { st.SlotLagBytes = &v })
}

// cpuHold takes the node's CPU slot unless the run holds it already.
func (r *run) cpuHold(ctx context.Context) error {
	if r.cpuHeld || r.s.env.CPU == nil {
		return nil
	}
	if err := r.s.env.CPU.Acquire(ctx); err != nil {
		return err
	}
	r.cpuHeld = true
	return nil
}

// cpuRelease gives the node's CPU slot back if the run holds it.
func (r *run) cpuRelease() {
	if r.cpuHeld {
		r.cpuHeld = false
		r.s.env.CPU.Release()
	}
}

// handle processes one pgoutput message (with the CPU slot held).
func (r *run) handle(ctx context.Context, data []byte) error {
	switch data[0] {
	case 'B':
		var m pglogrepl.BeginMessage
		if err := m.Decode(data[1:]); err != nil {
			return fmt.Errorf("pgoutput begin: %w", err)
		}
		r.begin(&m)
	case 'C':
		var m pglogrepl.CommitMessage
		if err := m.Decode(data[1:]); err != nil {
			return fmt.Errorf("pgoutput commit: %w", err)
		}
		return r.commit(ctx, &m)
	case 'R':
		var m pglogrepl.RelationMessage
		if err := m.Decode(data[1:]); err != nil {
			return fmt.Errorf("pgoutput relation: %w", err)
		}
		t := r.byName[m.Namespace+"."+m.RelationName]
		if t == nil {
			return nil
		}
		rel, err := relationFromStream(&m, t)
		if err != nil {
			return connector.Errorf("replica_identity", err, "%s no longer carries its key columns (%s) in the WAL; restore them or remove the table from the source", t.name, strings.Join(t.key, ", "))
		}
		r.rels[m.RelationID] = rel
	case 'I', 'U', 'D':
		return r.rowChange(ctx, data)
	case 'T':
		return r.truncate(ctx, data)
	case 'M':
		var m pglogrepl.LogicalDecodingMessage
		if err := m.Decode(data[1:]); err != nil {
			return fmt.Errorf("pgoutput message: %w", err)
		}
		switch m.Prefix {
		case r.hbPrefix():
			return r.heartbeatSeen(ctx, m.LSN)
		case r.snap.prefix:
			return r.snap.watermark(ctx, &m)
		}
	}
	return nil
}

// begin opens a transaction, deciding what of it is already in Queen.
func (r *run) begin(m *pglogrepl.BeginMessage) {
	r.cur = curTxn{open: true, t: txn{epoch: r.pend.Epoch, commit: m.FinalLSN}}
	pc := pglogrepl.LSN(r.pend.CommitLSN)
	switch {
	case m.FinalLSN < pc, m.FinalLSN == pc && r.pend.Seq < 0:
		r.cur.skipAll = true
	case m.FinalLSN == pc:
		r.cur.skip = r.pend.Seq
	}
	txnMeta(&r.cur.t.meta, m.FinalLSN, m.Xid, appendTS(nil, m.CommitTime))
	r.snap.xidSeen(m.Xid)
}

func (r *run) commit(ctx context.Context, m *pglogrepl.CommitMessage) error {
	if !r.cur.open {
		return fmt.Errorf("pgoutput: a commit at %s without a begin", m.CommitLSN)
	}
	r.cur.open = false
	if r.cur.skipAll {
		return nil
	}
	r.pend.CommitLSN, r.pend.Seq = lsnJSON(m.CommitLSN), -1
	if m.TransactionEndLSN > pglogrepl.LSN(r.pend.FlushLSN) {
		r.pend.FlushLSN = lsnJSON(m.TransactionEndLSN)
	}
	r.s.env.Metrics.SourceTransactions.Add(1)
	r.markDirty()
	if r.s.linger == 0 || r.full(0, 0) || r.c.idle() {
		return r.flush(ctx)
	}
	return nil
}

func (r *run) markDirty() {
	if !r.dirty {
		r.dirty = true
		r.deadline = time.Now().Add(r.s.linger)
	}
}

// full reports whether a bundle with n more messages of about size bytes
// would pass maxBundleMessages or maxBundleBytes.
func (r *run) full(n, size int) bool {
	return r.b.len()+n > r.s.spec.MaxBundleMessages || r.b.bytes+size >= r.s.spec.MaxBundleBytes
}

func (r *run) rowChange(ctx context.Context, data []byte) error {
	if !r.cur.open {
		return fmt.Errorf("pgoutput: a row change outside a transaction")
	}
	if r.cur.skipAll {
		return nil
	}
	c := &r.change
	if err := c.decode(data); err != nil {
		return err
	}
	idx := r.cur.seq
	r.cur.seq++
	if idx < r.cur.skip {
		return nil
	}
	rel := r.rels[c.relID]
	if rel == nil {
		return nil
	}
	r.lastData = time.Now()
	need := 1
	if c.op == 'U' && c.oldKind != 0 {
		need = 2
	}
	if r.b.len() > 0 && r.full(need, len(data)) {
		if err := r.flushPiece(ctx, idx); err != nil {
			return err
		}
	}
	if cols := r.enc.encodeChange(&r.b, rel, c, &r.cur.t, idx, nil, false); cols != nil {
		held := r.cpuHeld
		r.cpuRelease() // a query
		fill, err := r.readBack(ctx, rel, &c.new, cols)
		if err != nil {
			return err
		}
		if held {
			if err := r.cpuHold(ctx); err != nil {
				return err
			}
		}
		r.enc.encodeChange(&r.b, rel, c, &r.cur.t, idx, fill, fill == nil)
	}
	r.snap.observe(rel, c)
	r.markDirty()
	if r.full(0, 0) {
		return r.flushPiece(ctx, idx+1)
	}
	return nil
}

func (r *run) truncate(ctx context.Context, data []byte) error {
	if !r.cur.open || r.cur.skipAll {
		return nil
	}
	var m pglogrepl.TruncateMessage
	if err := m.Decode(data[1:]); err != nil {
		return fmt.Errorf("pgoutput truncate: %w", err)
	}
	for _, id := range m.RelationIDs {
		rel := r.rels[id]
		if rel == nil {
			continue
		}
		idx := r.cur.seq
		r.cur.seq++
		if idx < r.cur.skip || r.s.spec.OnTruncate != "emit" {
			continue
		}
		if r.b.len() > 0 && r.full(1, 256) {
			if err := r.flushPiece(ctx, idx); err != nil {
				return err
			}
		}
		r.enc.encodeTruncate(&r.b, rel, &r.cur.t, idx)
		r.markDirty()
	}
	return nil
}

// heartbeatSeen moves the confirmable position over an idle stretch.
func (r *run) heartbeatSeen(ctx context.Context, lsn pglogrepl.LSN) error {
	if lsn <= pglogrepl.LSN(r.pend.FlushLSN) {
		return nil
	}
	r.pend.FlushLSN = lsnJSON(lsn)
	r.markDirty()
	return r.flush(ctx)
}

// flushPiece pushes part of the open transaction: its first seq changes.
func (r *run) flushPiece(ctx context.Context, seq int) error {
	r.pend.CommitLSN, r.pend.Seq = lsnJSON(r.cur.t.commit), seq
	return r.flush(ctx)
}

// flush hands the pending messages and the pending pointer to the
// committer as one bundle (one broker transaction); its position is
// confirmed to PostgreSQL once the committer committed it.
func (r *run) flush(ctx context.Context) error {
	if !r.dirty {
		return nil
	}
	b := &bundle{ptr: r.pend}
	b.items, b.arena = r.b.pushItems()
	// Once handed over, b is the committer's (it gives the buffers back).
	n, ptr := len(b.items), b.ptr
	r.pend = r.pend.clone()
	r.dirty = false
	// Handing over may wait for the committer, and the slot lag is a
	// query: not with the slot held.
	held := r.cpuHeld
	r.cpuRelease()
	if err := r.c.hand(ctx, b); err != nil {
		// The pending pointer now lies past messages nobody will push.
		r.broken = true
		return err
	}
	if h := r.s.hooks; h != nil && h.handed != nil {
		h.handed(n, ptr)
	}
	if time.Since(r.lastLag) >= statusInterval {
		r.slotLag(ctx)
	}
	if held {
		return r.cpuHold(ctx)
	}
	return nil
}

// readBack reads cols of the row with new's key from the table (a moved
// row's unchanged TOAST values); nil when the row is gone.
func (r *run) readBack(ctx context.Context, rel *relation, new *tuple, cols []int) (*tuple, error) {
	t := r.byName[rel.name]
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = pgx.Identifier{rel.cols[c].name}.Sanitize()
	}
	where := make([]string, len(rel.key))
	params := make([][]byte, len(rel.key))
	for i, k := range rel.key {
		typ := "text"
		if j := indexOf(t.cols, rel.cols[k].name); j >= 0 {
			typ = t.types[j]
		}
		where[i] = fmt.Sprintf("%s = $%d::%s", pgx.Identifier{rel.cols[k].name}.Sanitize(), i+1, typ)
		params[i] = new.val[k]
	}
	sql := "SELECT " + strings.Join(sel, ", ") + " FROM " + t.quotedName() + " WHERE " + strings.Join(where, " AND ")
	rr := r.q.PgConn().ExecParams(ctx, sql, params, nil, nil, nil)
	f := &r.fill
	f.reset(len(rel.cols))
	for i := range f.kind {
		f.kind[i], f.val[i] = colUnchanged, nil
	}
	found := false
	for rr.NextRow() {
		found = true
		for i, v := range rr.Values() {
			if v == nil {
				f.kind[cols[i]] = colNull
			} else {
				f.kind[cols[i]], f.val[cols[i]] = colText, append([]byte{}, v...)
			}
		}
	}
	if _, err := rr.Close(); err != nil {
		return nil, fmt.Errorf("read back the unchanged values of a moved row of %s: %w", rel.name, err)
	}
	if !found {
		return nil, nil
	}
	return f, nil
}
