package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	etcdraft "go.etcd.io/raft/v3"

	"github.com/queen-mq/queen/internal/stagetime"
	"github.com/queen-mq/queen/internal/state"
)

// proposal is one command on its way into the log. Several callers may wait
// for it (a retry that finds the original still in flight).
type proposal struct {
	id   reqID
	cmd  state.Command
	size int
	done chan struct{} // closed once res is set
	res  result
	// trace times the request's stages (nil unless a benchmark switched
	// stagetime on).
	trace *stagetime.Trace
	// proposed is set once raft took the entry holding it: a leader that
	// loses office then fails it as "may have been applied".
	proposed atomic.Bool
	once     sync.Once
	// entry times the log entry holding it (nil unless timing is on).
	entry *stagetime.Entry
}

// finish hands the proposal its result, once.
func (p *proposal) finish(r result) {
	p.once.Do(func() {
		p.entry.Mark(stagetime.Returned)
		p.res = r
		close(p.done)
	})
}

type result struct {
	val any
	err error
	oc  outcome
}

// outcome classifies a failed attempt.
type outcome int

const (
	outNotApplied outcome = iota // certainly not applied: try again freely
	outMaybe                     // may have been applied: try again as a retry
	outFinal                     // give up with this error
)

// request is one command submitted on this node, kept across attempts.
type request struct {
	id       reqID
	cmd      state.Command
	size     int
	retry    bool   // an earlier attempt may have been applied
	minIndex uint64 // the original cannot be at or below this log index
}

// Submit has a command applied through the leader and returns its result.
// On the leader, concurrent submissions are grouped into one log entry
// (group commit); a follower forwards the command to the leader over the
// raft port, where it joins the same group commit. When an attempt's outcome
// is unknown (the leader failed with it in flight) the same command, with
// the same ids, goes to the next leader, which answers a command it already
// applied with the recorded result instead of applying it twice. Submit
// tries until ctx ends.
func (n *Node) Submit(ctx context.Context, cmd state.Command, size int) (any, error) {
	if n.closed.Load() {
		return nil, ErrShutdown
	}
	if err := n.HaltError(); err != nil {
		return nil, err
	}
	if err := n.disk.refuse(); err != nil && !allowedWhenFull(cmd) {
		return nil, err
	}
	req := &request{id: newReqID(), cmd: cmd, size: size, minIndex: n.commit.Load()}
	bo := newBackoff()
	var lastErr error
	for {
		if n.closed.Load() {
			return nil, ErrShutdown
		}
		var (
			v   any
			oc  outcome
			err error
		)
		if n.IsLeader() {
			v, oc, err = n.submitLocal(ctx, req)
		} else if addr, id := n.LeaderAddr(); addr != "" && id != n.id {
			v, oc, err = n.forwardSubmit(ctx, addr, req)
		} else {
			oc, err = outNotApplied, errors.New("no leader is known")
		}
		if err == nil {
			return v, nil
		}
		switch oc {
		case outFinal:
			return nil, err
		case outMaybe:
			if ctx.Err() != nil && isContextErr(err) {
				// The caller gave up while its command waits in the log
				// (or on the way there); no leader changed. The command
				// is still shared with that proposal: leave it alone.
				if req.retry {
					return nil, fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
				}
				return nil, fmt.Errorf("%w (the request ended while its command was in flight; it may still be applied)", ctx.Err())
			}
			if !req.retry {
				req.retry = true
				// The state machine also checks server-generated ids of a
				// re-proposed push (belt and braces with the request id).
				req.cmd = retried(req.cmd)
			}
		}
		lastErr = err
		if !bo.wait(ctx, n.closing) {
			if n.closed.Load() {
				return nil, ErrShutdown
			}
			if errors.Is(lastErr, context.Canceled) || errors.Is(lastErr, context.DeadlineExceeded) {
				if req.retry {
					return nil, fmt.Errorf("%w: %v", ErrOutcomeUnknown, lastErr)
				}
				return nil, lastErr
			}
			if req.retry {
				return nil, fmt.Errorf("%w (last error: %v)", ErrOutcomeUnknown, lastErr)
			}
			return nil, fmt.Errorf("%w: no leader took the write before the deadline (last error: %v)", ErrNotLeader, lastErr)
		}
	}
}

type queuedKey struct{}

// OnQueued returns a context under which Submit calls fn once the command
// is queued for proposal on this node, as leader. A command this node
// queues after fn has run comes after it in the log. (Not called when the
// command is forwarded to another node.)
func OnQueued(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, queuedKey{}, fn)
}

// submitLocal proposes on this node, which must lead. It never forwards.
func (n *Node) submitLocal(ctx context.Context, req *request) (any, outcome, error) {
	if !n.IsLeader() {
		return nil, outNotApplied, ErrNotLeader
	}
	if err := n.disk.refuse(); err != nil && !allowedWhenFull(req.cmd) {
		return nil, outFinal, err
	}
	d := n.dedup
	d.mu.Lock()
	if p := d.pending[req.id]; p != nil {
		d.mu.Unlock()
		return n.await(ctx, p)
	}
	if a := d.applied[req.id]; a != nil {
		if a.hasVal {
			val, idx := a.val, a.index
			d.mu.Unlock()
			if n.needsSync(req.cmd) {
				// Its first reply waited for the fsync of its entry; so
				// does this one.
				if err := n.fsync.waitSynced(ctx.Done(), idx); err != nil {
					if errors.Is(err, errWaitEnded) {
						return nil, outMaybe, ctx.Err()
					}
					return nil, outFinal, err
				}
			}
			return n.restoreResult(req.cmd, val)
		}
		// Applied before this node restarted: the result is gone.
		if !safeToRepeat(req.cmd) {
			d.mu.Unlock()
			return nil, outFinal, ErrOutcomeUnknown
		}
		req.cmd = retried(req.cmd)
	} else if req.retry && !d.covers(req.minIndex) {
		if !safeToRepeat(req.cmd) {
			d.mu.Unlock()
			return nil, outFinal, ErrOutcomeUnknown
		}
		req.cmd = retried(req.cmd)
	}
	p := &proposal{id: req.id, cmd: req.cmd, size: req.size, done: make(chan struct{}), trace: stagetime.From(ctx)}
	d.pending[req.id] = p
	d.mu.Unlock()
	p.trace.Mark(stagetime.Queued)
	// The ready loop takes it from here (proposeQueued): no goroutine sits
	// between the caller and raft.
	n.propq.put(p)
	if fn, ok := ctx.Value(queuedKey{}).(func()); ok {
		fn()
	}
	return n.await(ctx, p)
}

func (n *Node) dropPending(p *proposal) {
	n.dedup.mu.Lock()
	if n.dedup.pending[p.id] == p {
		delete(n.dedup.pending, p.id)
	}
	n.dedup.mu.Unlock()
}

func (n *Node) await(ctx context.Context, p *proposal) (any, outcome, error) {
	select {
	case <-p.done:
		return p.res.val, p.res.oc, p.res.err
	case <-ctx.Done():
		// The command may still be applied; its result is dropped.
		return nil, outMaybe, ctx.Err()
	case <-n.closing:
		return nil, outFinal, ErrShutdown
	case <-n.halted:
		return nil, outFinal, n.HaltError()
	}
}

// retried marks a command for re-proposal on a copy (state.Retryable).
func retried(c state.Command) state.Command {
	if r, ok := c.(state.Retryable); ok {
		return r.Retried()
	}
	return c
}

// safeToRepeat reports whether applying a command a second time gives the
// caller a correct answer: pushes (deduplicated by transaction id),
// transactions of pushes only, ticks, lease extensions and configure.
func safeToRepeat(c state.Command) bool {
	switch c := c.(type) {
	case *state.Push, *state.Tick, *state.ExtendLease, *state.Configure:
		return true
	case *state.Txn:
		if len(c.RequiredLeases) > 0 {
			return false
		}
		for i := range c.Ops {
			if c.Ops[i].Type != state.OpPush {
				return false
			}
		}
		return true
	}
	return false
}

// An entry holds at most maxEntryCmds commands and about maxEntryBytes
// bytes: raft-wal keeps, for each segment still in the log, a write buffer
// the size of its largest append rounded up to a power of two, so entries
// of many MiB (64 producers' batches of 1 KiB messages) would pin that
// much memory per segment; group commit still writes all the entries
// ready at once.
const (
	maxEntryCmds  = 1024
	maxEntryBytes = 1 << 20
)

// finish hands each proposal its result and forgets it as pending (the
// fsm has recorded it as applied by then, when it was).
func (n *Node) finish(batch []*proposal, res func(i int) result) {
	n.dedup.mu.Lock()
	for _, p := range batch {
		if n.dedup.pending[p.id] == p {
			delete(n.dedup.pending, p.id)
		}
	}
	n.dedup.mu.Unlock()
	for i, p := range batch {
		p.finish(res(i))
	}
}

// proposeQueued proposes, on the ready loop, every command queued since
// the last call, grouped into entries of at most maxEntryCmds commands and
// maxEntryBytes bytes. What queues while the loop handles a Ready shares
// the next entry (group commit), and a lone command is proposed at once.
func (n *Node) proposeQueued() {
	taken := n.propq.takeNow()
	queued := taken
	for len(queued) > 0 {
		k, size := 1, queued[0].size
		for k < len(queued) && k < maxEntryCmds && size < maxEntryBytes {
			size += queued[k].size
			k++
		}
		n.propose(queued[:k:k])
		queued = queued[k:]
	}
	// propose keeps no slice of the batch (its error paths copy it).
	n.propq.recycle(taken)
}

// propose encodes batch as one entry and hands it to raft (ready loop).
func (n *Node) propose(batch []*proposal) {
	en := &state.Entry{Time: time.Now().UnixMicro(), Cmds: make([]state.Command, len(batch))}
	ids := make([]reqID, len(batch))
	for i, p := range batch {
		en.Cmds[i] = p.cmd
		ids[i] = p.id
	}
	st := stageEntry(batch)
	st.Mark(stagetime.Encode)
	if st != nil {
		for _, p := range batch {
			p.entry = st
		}
	}
	// A leader's raft copies the entry into its log (raft.appendEntry
	// clones every proposed entry), so the buffer is this loop's again once
	// Propose returns; a follower's raft would forward the message holding
	// it to the leader, so a proposal made while not leading gets a buffer
	// of its own.
	leading := n.rn.BasicStatus().RaftState == etcdraft.StateLeader
	var buf []byte
	if leading {
		buf = n.propBuf
	}
	wrapped, err := encodeProposal(buf, ids, en)
	if err != nil {
		batch = slices.Clone(batch)
		go n.finish(batch, func(int) result { return result{err: err, oc: outFinal} })
		return
	}
	st.Register(dataKey(wrapped))
	st.Mark(stagetime.Handed)
	n.countDrops(en.Cmds)
	if err := n.rn.Propose(wrapped); err != nil {
		// Refused before it was appended (no leader, a transfer).
		batch = slices.Clone(batch)
		go n.finish(batch, func(int) result { return result{err: fmt.Errorf("%w: %v", ErrNotLeader, err), oc: outNotApplied} })
		return
	}
	if leading && cap(wrapped) <= maxPropBuf {
		n.propBuf = wrapped[:0]
	}
	for _, p := range batch {
		p.proposed.Store(true)
	}
	n.wakeEarly(en.Cmds)
}

// maxPropBuf bounds the proposal buffer the ready loop keeps between
// proposals: entries are about maxEntryBytes at most, but one large
// command makes an entry of its own size, and a buffer that large is not
// kept.
const maxPropBuf = 2 << 20

// wakeEarly wakes the long-polling pops of the queues these commands push
// to as soon as the leader has put them in its log, not once they are
// applied (Config.OnWake). A pop proposed now comes after the pushes in the
// log, so it is applied after them and delivers what they pushed, and its
// reply waits for its own entry, which is never synced before the pushes'.
// Its log write (and fsync) then follows theirs at once instead of after
// their apply and a hand-over. The state machine still wakes them when it
// applies the pushes (followers, and pushes it refused are waking for
// nothing, which a waiting pop takes as "look again").
func (n *Node) wakeEarly(cmds []state.Command) {
	if n.cfg.OnWake == nil || n.rstate.Load() != int32(etcdraft.StateLeader) {
		return
	}
	var wakes []state.Wake
	add := func(tenant string, items []state.PushItem) {
		for i := range items {
			w := state.Wake{Tenant: tenant, Queue: items[i].Queue}
			if !slices.Contains(wakes, w) {
				wakes = append(wakes, w)
			}
		}
	}
	for _, c := range cmds {
		switch c := c.(type) {
		case *state.Push:
			add(c.Tenant, c.Items)
		case *state.Txn:
			for i := range c.Ops {
				if c.Ops[i].Type == state.OpPush {
					add(c.Tenant, c.Ops[i].Items)
				}
			}
		}
	}
	if len(wakes) > 0 {
		at := make([]uint64, len(wakes))
		for i := range at {
			at[i] = math.MaxUint64
		}
		n.cfg.OnWake(wakes, at)
	}
}

// countDrops counts the commands that delete subscriptions
// (SubscriptionDrops), before they go into the log: a broker that knows
// a group drained does not pop it again until a wake, and a deleted
// group must be created again by the next pop.
func (n *Node) countDrops(cmds []state.Command) {
	for _, c := range cmds {
		switch c.(type) {
		case *state.DeleteQueue, *state.DeleteGroup:
			n.subDrops.Add(1)
		}
	}
}

// restoreResult answers a retried command with the result the index kept
// of its first application (dedup's record).
func (n *Node) restoreResult(cmd state.Command, val any) (any, outcome, error) {
	var res any
	ok := true
	switch rec := val.(type) {
	case *state.PopRecord:
		return n.restorePop(rec)
	case *state.PushRecord:
		c, _ := cmd.(*state.Push)
		res, ok = rec.Result(c)
	case *state.AckRecord:
		c, _ := cmd.(*state.Ack)
		res, ok = rec.Result(c)
	default:
		res = val
	}
	if !ok {
		// Not the command the result came from: a request id reused for
		// another command, which no caller of Submit does.
		n.log.Error("a retried request does not match the command its id was first applied with; its outcome is reported unknown", "command", fmt.Sprintf("%T", cmd))
		return nil, outFinal, ErrOutcomeUnknown
	}
	return res, outNotApplied, nil
}

// restorePop answers a retried pop with its first result, the messages
// read back from the store. A message gone since (retention, a deletion)
// makes the first answer impossible to give again: the outcome is then
// unknown to the caller, as if the result had been forgotten, and the
// pop's lease runs out on its own.
func (n *Node) restorePop(rec *state.PopRecord) (any, outcome, error) {
	r := n.Store().Reader()
	defer r.Close()
	res, ok := r.RestorePop(rec)
	if !ok {
		n.log.Warn("a retried pop's messages are gone since it was applied; its outcome is reported unknown", "messages", rec.Messages(), "lease_id", rec.LeaseID)
		return nil, outFinal, ErrOutcomeUnknown
	}
	return res, outNotApplied, nil
}
