package broker

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/queen-mq/queen/internal/state"
)

// waiters holds long-polling pops, keyed by tenant and queue.
//
// A wake tells a waiter to pop again only when its pop may not have seen
// what woke it. Every wake names a change that is in the log before the
// wake is sent: an early wake (wakeQueued) a push just queued for the log,
// a wake from the state machine (wake) a change applied at or below the
// applied index read when the wake is sent. A pop queued after a commit
// index C comes after every entry at or below C, so a wake of the second
// kind sent with an applied index at or below C is covered by that pop:
// above all the state machine's wake for the very push a pop delivered,
// which otherwise sends the consumer's next long poll round for an empty
// pop.
type waiters struct {
	mu      sync.Mutex
	m       map[state.Wake]map[*waiter]struct{}
	closed  bool
	applied atomic.Pointer[func() uint64]
}

// waiter is one long-polling pop.
type waiter struct {
	ch chan struct{}
	// covered is the commit index read before its last pop was queued:
	// that pop saw every change at or below it.
	covered atomic.Uint64
}

func newWaiters() *waiters { return &waiters{m: map[state.Wake]map[*waiter]struct{}{}} }

// setApplied gives the waiters the state machine's applied index; until
// then every wake is passed on.
func (w *waiters) setApplied(fn func() uint64) { w.applied.Store(&fn) }

func (w *waiters) add(k state.Wake) *waiter {
	wt := &waiter{ch: make(chan struct{}, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		wt.ch <- struct{}{}
		return wt
	}
	set := w.m[k]
	if set == nil {
		set = map[*waiter]struct{}{}
		w.m[k] = set
	}
	set[wt] = struct{}{}
	return wt
}

// popping is called just before the waiter queues a pop, with the commit
// index read before it: wakes received until then are covered by that pop
// and are dropped, and later wakes of changes at or below the index are
// not passed on.
func (wt *waiter) popping(commit uint64) {
	wt.covered.Store(commit)
	select {
	case <-wt.ch:
	default:
	}
}

func (w *waiters) remove(k state.Wake, wt *waiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if set := w.m[k]; set != nil {
		delete(set, wt)
		if len(set) == 0 {
			delete(w.m, k)
		}
	}
}

// wake is the state machine's wake (cluster.Config.OnWake): the changes
// that woke ks are applied at or below the applied index now.
func (w *waiters) wake(ks []state.Wake) {
	applied := uint64(math.MaxUint64)
	if fn := w.applied.Load(); fn != nil {
		applied = (*fn)()
	}
	w.signal(ks, applied)
}

// wakeQueued wakes the waiters of ks for a push queued for the log on
// this node and not yet applied: every waiter looks again.
func (w *waiters) wakeQueued(ks []state.Wake) { w.signal(ks, math.MaxUint64) }

func (w *waiters) signal(ks []state.Wake, applied uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range ks {
		for wt := range w.m[k] {
			if applied <= wt.covered.Load() {
				continue
			}
			select {
			case wt.ch <- struct{}{}:
			default:
			}
		}
	}
}

func (w *waiters) closeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, set := range w.m {
		for wt := range set {
			select {
			case wt.ch <- struct{}{}:
			default:
			}
		}
	}
}
