package pgsource

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// queueBundles bounds how many bundles wait for the committer beside the
// ones it commits: memory stays within a few maxBundleBytes.
const queueBundles = 2

// pipelineDepth is how many bundles' broker transactions may be in flight
// at once. Beyond 1, the next is proposed while the one before is
// appended, synced and applied, conditioned on the pointer value that one
// writes. On one node the broker's apply of a bundle is what a bundle
// waits for, and a second one in flight only adds CPU
// (docs/design/source.md, "Two bundles in flight"): 1.
const pipelineDepth = 1

// bundle is one broker transaction's worth: the messages and the pointer
// that covers them (never changed once handed over).
type bundle struct {
	items []broker.PushItem
	// arena backs the items' payloads.
	arena []byte
	ptr   *pointer
}

// committer commits the bundles the reader hands it, strictly in order,
// each pointer write conditional on the pointer the one before wrote: on
// its version when nothing is in flight, else on the value of the write
// in flight (kv.checkValue), so that up to pipelineDepth transactions are
// in flight and none commits unless every one before it did. Only once a
// bundle is committed (and, with interval durability, synced) does its
// flushLsn become confirmable.
type committer struct {
	r     *run
	queue chan *bundle
	// inflight counts bundles handed over and not yet committed.
	inflight atomic.Int32
	// drop: the run ended; queued bundles are not committed.
	drop atomic.Bool
	// synced is the flushLsn of the last bundle committed and on disk:
	// what the stream may confirm to PostgreSQL.
	synced atomic.Uint64
	// Under interval durability an acknowledged write may still be lost
	// with the nodes' page caches, and PostgreSQL may recycle WAL only
	// once what it held is on disk: committed is the last bundle's
	// flushLsn, which a syncer moves to synced after broker.WaitSynced,
	// beside the commits rather than in their way.
	interval  bool
	committed atomic.Uint64
	wake      chan struct{}
	// failed closes when a commit failed; err says why.
	failed   chan struct{}
	failOnce sync.Once
	err      error
	wg       sync.WaitGroup
}

func newCommitter(r *run) *committer {
	c := &committer{r: r, queue: make(chan *bundle, queueBundles), failed: make(chan struct{}),
		interval: r.s.env.Broker.Durability() != "always", wake: make(chan struct{}, 1)}
	// The committer hands committed bundles' buffers back to the reader:
	// as many as may be committing, queued and being built at once.
	r.b.spares = make(chan bundleBufs, queueBundles+2)
	c.synced.Store(uint64(r.ptr.FlushLSN))
	c.committed.Store(uint64(r.ptr.FlushLSN))
	return c
}

// start runs the committer until the queue is closed and drained, ctx
// ends, or a commit fails (then stop is called with the error).
func (c *committer) start(ctx context.Context, stop context.CancelCauseFunc) {
	fail := func(err error) {
		c.failOnce.Do(func() {
			c.err = err
			close(c.failed)
			stop(err)
		})
	}
	done := make(chan struct{})
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(done)
		if err := c.loop(ctx); err != nil {
			fail(err)
			// Bundles read ahead are dropped: the next run reads them
			// again from the pointer.
			for range c.queue {
			}
		}
	}()
	if !c.interval {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			select {
			case <-c.wake:
			case <-done:
				// The last commits' positions wait for the next run.
				return
			}
			v := c.committed.Load()
			if err := c.waitSynced(ctx); err != nil {
				fail(err)
				return
			}
			c.synced.Store(v)
		}
	}()
}

// waitSynced returns once every commit so far is on disk on a quorum
// (through the waitSynced hook in tests, which may hold it).
func (c *committer) waitSynced(ctx context.Context) error {
	wait := c.r.s.env.Broker.WaitSynced
	if h := c.r.s.hooks; h != nil && h.waitSynced != nil {
		return h.waitSynced(ctx, wait)
	}
	return wait(ctx)
}

// hand gives b to the committer, waiting while the queue is full.
func (c *committer) hand(ctx context.Context, b *bundle) error {
	c.inflight.Add(1)
	select {
	case c.queue <- b:
		return nil
	case <-c.failed:
		return c.err
	case <-ctx.Done():
		c.inflight.Add(-1)
		return ctx.Err()
	}
}

// idle reports whether no bundle is queued or being committed.
func (c *committer) idle() bool { return c.inflight.Load() == 0 }

// pending reports bundles whose positions are not yet confirmable.
func (c *committer) pending() bool {
	return !c.idle() || c.synced.Load() < c.committed.Load()
}

// abandon drops the queued bundles (the next run reads them again) and
// waits for the commit under way.
func (c *committer) abandon() {
	c.drop.Store(true)
	c.close()
}

// close ends the queue and waits for the committer to finish it.
func (c *committer) close() {
	close(c.queue)
	c.wg.Wait()
}

// failure is the commit error that stopped the run, if any.
func (c *committer) failure() error {
	select {
	case <-c.failed:
		return c.err
	default:
		return nil
	}
}

// flight is one bundle's broker transaction, proposed and not yet
// confirmed by the committer.
type flight struct {
	b     *bundle
	value []byte // the pointer as this transaction writes it
	write uint64 // its number (pointerStore.writes)
	// chained: conditioned on the value of the write before it, which was
	// in flight when this one was proposed (else on the version).
	chained bool
	version uint64 // the pointer's version once committed
	err     error
	done    chan struct{}
	// queued closes once the transaction is queued for the log on this
	// node (or has returned): the next is proposed only then, so that it
	// comes after this one in the log.
	queued chan struct{}
}

// loop commits the queue's bundles in order, up to pipelineDepth at once,
// until the queue is closed and drained or a commit fails. It returns only
// once no transaction of its own is in flight.
func (c *committer) loop(ctx context.Context) error {
	var flights, redo []*flight
	queue := c.queue
	depth := pipelineDepth
	if h := c.r.s.hooks; h != nil && h.depth > 0 {
		depth = h.depth
	}
	wait := func() {
		for _, f := range flights {
			<-f.done
		}
	}
	for queue != nil || len(flights) > 0 || len(redo) > 0 {
		// Bundles to propose again come before the queue's.
		if len(redo) > 0 && len(flights) < depth {
			f := redo[0]
			redo = redo[1:]
			flights = append(flights, c.launch(ctx, f.b, flights))
			continue
		}
		var head chan struct{}
		if len(flights) > 0 {
			head = flights[0].done
		}
		in := queue
		if len(flights) >= depth || len(redo) > 0 {
			in = nil
		}
		select {
		case b, ok := <-in:
			if !ok {
				queue = nil
				continue
			}
			if c.drop.Load() {
				continue
			}
			if err := c.before(b); err != nil {
				wait()
				return err
			}
			flights = append(flights, c.launch(ctx, b, flights))
		case <-head:
			f := flights[0]
			flights = flights[1:]
			if f.err != nil && f.chained && isConditionFailed(f.err) {
				// Every transaction before f committed, so f's condition
				// failed because f was applied before its predecessor
				// (two proposals may enter the log in either order) or
				// because another owner moved the pointer. The ones
				// behind f are conditioned on f's write, which did not
				// happen: they fail too. Propose them again in order,
				// f first on the version: if that fails, the pointer
				// is another owner's.
				wait()
				for _, g := range flights {
					if g.err == nil {
						return fmt.Errorf("bundle %s committed though the bundle before it did not (%v)", g.b.ptr.position(), f.err)
					}
					if !isConditionFailed(g.err) {
						return fmt.Errorf("push a bundle with the pointer: %w", g.err)
					}
				}
				redo = append(append([]*flight{f}, flights...), redo...)
				flights = nil
				continue
			}
			if err := c.land(f); err != nil {
				wait()
				return err
			}
		}
	}
	return nil
}

// before runs the beforeCommit hook (a crash injected there stops the
// run as if the process died before proposing b).
func (c *committer) before(b *bundle) error {
	if h := c.r.s.hooks; h != nil && h.beforeCommit != nil {
		return h.beforeCommit(len(b.items), b.ptr)
	}
	return nil
}

// launch proposes b's transaction behind flights (those in flight, in
// order): conditioned on the last one's pointer value, or on the
// committed pointer's version when none is in flight.
func (c *committer) launch(ctx context.Context, b *bundle, flights []*flight) *flight {
	ps := &c.r.ps
	ops := make([]broker.TxnOp, 0, len(b.items)/broker.MaxPushItems+3)
	for start := 0; start < len(b.items); start += broker.MaxPushItems {
		end := min(start+broker.MaxPushItems, len(b.items))
		ops = append(ops, broker.TxnOp{Type: broker.OpPush, Items: b.items[start:end]})
	}
	f := &flight{b: b, done: make(chan struct{}), queued: make(chan struct{})}
	var prev *flight
	var err error
	if n := len(flights); n > 0 {
		prev = flights[n-1]
		f.write, f.chained = prev.write+1, true
		var pops []broker.TxnOp
		if pops, f.value, err = ps.chained(b.ptr, f.write, prev.value); err == nil {
			ops = append(ops, pops...)
		}
	} else {
		var op broker.TxnOp
		f.write = ps.writes + 1
		if op, err = ps.op(b.ptr); err == nil {
			f.value = op.Value
			ops = append(ops, op)
		}
	}
	if err != nil {
		f.err = fmt.Errorf("encode the source's pointer: %w", err)
		close(f.queued)
		close(f.done)
		return f
	}
	req := broker.TxnRequest{Tenant: ps.tenant, Ops: ops, Internal: true, NoPushOutcomes: true}
	var once sync.Once
	queued := func() { once.Do(func() { close(f.queued) }) }
	go func() {
		defer close(f.done)
		defer queued()
		if prev != nil {
			// Proposed after prev: a transaction that entered the log
			// before its predecessor fails its condition and is proposed
			// again, which costs a round trip.
			select {
			case <-prev.queued:
			case <-ctx.Done():
			}
		}
		do := func() error {
			out, err := ps.b.Transaction(broker.OnQueued(ctx, queued), req)
			if err == nil {
				f.version = out[len(out)-1].Version
			}
			return err
		}
		if h := c.r.s.hooks; h != nil && h.txn != nil {
			f.err = h.txn(len(b.items), b.ptr, queued, do)
		} else {
			f.err = do()
		}
	}()
	return f
}

// land takes up f, the oldest transaction in flight, once it returned.
func (c *committer) land(f *flight) error {
	r := c.r
	if f.err != nil {
		if isConditionFailed(f.err) {
			return &lostError{err: f.err}
		}
		return fmt.Errorf("push a bundle with the pointer: %w", f.err)
	}
	b := f.b
	r.ps.version, r.ps.writes = f.version, f.write
	r.ptr = b.ptr
	if h := r.s.hooks; h != nil && h.afterCommit != nil {
		if err := h.afterCommit(len(b.items), b.ptr); err != nil {
			return err
		}
	}
	if c.interval {
		c.committed.Store(uint64(b.ptr.FlushLSN))
		select {
		case c.wake <- struct{}{}:
		default:
		}
	} else {
		c.synced.Store(uint64(b.ptr.FlushLSN))
	}
	c.inflight.Add(-1)
	m := r.s.env.Metrics
	n := uint64(len(b.items))
	m.SourceBundles.Add(1)
	m.SourceMessages.Add(float64(n))
	r.b.giveBack(b.items, b.arena)
	b.items, b.arena = nil, nil
	r.s.env.Status.Update(func(st *connector.Status) { st.Messages += n })
	r.publishStatus()
	return nil
}
