package pgsource

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// queueBundles bounds how many bundles wait for the committer beside the
// one it commits: memory stays within a few maxBundleBytes.
const queueBundles = 2

// bundle is one broker transaction's worth: the messages and the pointer
// that covers them (never changed once handed over).
type bundle struct {
	items []broker.PushItem
	ptr   *pointer
}

// committer commits the bundles the reader hands it, strictly in order and
// one at a time, each pointer write conditional on the version the one
// before produced. Only once a bundle is committed (and, with interval
// durability, synced) does its flushLsn become confirmable.
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
		for b := range c.queue {
			if c.drop.Load() {
				continue
			}
			if err := c.commit(ctx, b); err != nil {
				fail(err)
				// Bundles read ahead are dropped: the next run reads
				// them again from the pointer.
				for range c.queue {
				}
				return
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

func (c *committer) commit(ctx context.Context, b *bundle) error {
	r := c.r
	ops := make([]broker.TxnOp, 0, len(b.items)/broker.MaxPushItems+2)
	for start := 0; start < len(b.items); start += broker.MaxPushItems {
		end := min(start+broker.MaxPushItems, len(b.items))
		ops = append(ops, broker.TxnOp{Type: broker.OpPush, Items: b.items[start:end]})
	}
	if h := r.s.hooks; h != nil && h.beforeCommit != nil {
		if err := h.beforeCommit(len(b.items), b.ptr); err != nil {
			return err
		}
	}
	if err := r.ps.commit(ctx, ops, b.ptr); err != nil {
		return err
	}
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
	m.SourceBundles.Add(1)
	m.SourceMessages.Add(float64(len(b.items)))
	n := uint64(len(b.items))
	r.s.env.Status.Update(func(st *connector.Status) { st.Messages += n })
	r.publishStatus()
	return nil
}
