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
// what woke it. Positions order the log's commands (state.Position). A
// wake from the state machine (wake) carries the position of the last
// change of its batch that woke the queue; an early wake (wakeQueued, and
// the leader's wake of a push it just put in its log) carries none
// (math.MaxUint64): the push is not applied, and a pop queued after it
// comes after it in the log. A waiter is covered up to a position when its
// pop saw every change before it: a pop queued after the commit index C is
// read comes after the entries up to C, and a pop's result gives its own
// position. A wake of a change below the waiter's cover is dropped: above
// all the state machine's wake for the very push a pop delivered, which
// otherwise sends the consumer's next long poll round for an empty pop.
//
// The waiters also remember what the last long poll of each group left
// (noteDrained): when that pop drained the group (state.PopResult.Drained)
// and no wake of a change at or after it came since, the next long poll
// of the group parks at once, covered up to that pop, instead of proposing
// a pop that would find nothing (see park).
type waiters struct {
	mu     sync.Mutex
	m      map[state.Wake]map[*waiter]struct{}
	closed bool
	// queues is what the long polls of each queue on this node left. An
	// entry is made by the first long poll of the queue, before its pop
	// is proposed, and kept: from then on every wake of the queue is seen.
	queues map[state.Wake]*queueMarks
	// parkedFirst counts the long polls that parked without popping.
	parkedFirst atomic.Uint64
}

// queueMarks is what long polls left on one queue.
type queueMarks struct {
	// woke is the highest position of a state machine wake of the queue.
	woke uint64
	// queued counts the pushes to the queue queued for the log on this
	// node (wakeQueued): one counted after a pop read the count may come
	// after that pop in the log, one counted before it comes before it.
	queued atomic.Uint64
	groups map[string]popMark
}

// popMark is what the last long poll's pop of a group (the one at the
// highest position) left.
type popMark struct {
	at      uint64 // the pop's position
	drained bool
	epoch   popEpoch
	queued  uint64 // the queue's count of queued pushes before the pop was queued
}

// popEpoch is the leadership a pop was proposed under: a mark is only
// trusted under the same one (popEpochOf).
type popEpoch struct {
	term  uint64 // cluster.Node.LeaderTerm; 0: not leading
	drops uint64 // cluster.Node.SubscriptionDrops
}

// trusted reports whether a mark made under e may be used under now. The
// node must have led throughout (its state machine applied every entry
// since and sent every wake), and no queue or group may have been deleted
// since: a skipped pop would not create the group again.
func (e popEpoch) trusted(now popEpoch) bool { return e.term != 0 && e == now }

// waiter is one long-polling pop.
type waiter struct {
	ch chan struct{}
	// covered is the position below which the waiter's last pop saw every
	// change.
	covered atomic.Uint64
	q       *queueMarks
	// queued is q.queued read before the waiter's last pop was queued.
	queued uint64
}

func newWaiters() *waiters {
	return &waiters{m: map[state.Wake]map[*waiter]struct{}{}, queues: map[state.Wake]*queueMarks{}}
}

// park registers a long poll of group (a pop of any partition, skip false:
// of one) in queue k, made under epoch. It reports whether the poll may
// park without popping: the group's last long poll on this node drained
// it under the same epoch, no wake of a change at or after that pop came
// since, and no push to the queue was queued on this node after that pop
// was. The waiter is then covered up to that pop, so that any later change
// wakes it: a wake sent before park is in the queue's woke (or its count
// of queued pushes), one sent after it signals the waiter. The very first
// poll of a group always pops (it may create the group, which fixes its
// start).
func (w *waiters) park(k state.Wake, group string, epoch popEpoch, skip bool) (*waiter, bool) {
	wt := &waiter{ch: make(chan struct{}, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		wt.ch <- struct{}{}
		return wt, false
	}
	set := w.m[k]
	if set == nil {
		set = map[*waiter]struct{}{}
		w.m[k] = set
	}
	set[wt] = struct{}{}
	q := w.queues[k]
	if q == nil {
		q = &queueMarks{groups: map[string]popMark{}}
		w.queues[k] = q
	}
	wt.q = q
	mk, ok := q.groups[group]
	if skip && ok && mk.drained && mk.epoch.trusted(epoch) && q.woke < mk.at && q.queued.Load() == mk.queued {
		wt.covered.Store(mk.at)
		w.parkedFirst.Add(1)
		return wt, true
	}
	return wt, false
}

// add registers a long poll that pops first (tests).
func (w *waiters) add(k state.Wake) *waiter {
	wt, _ := w.park(k, "", popEpoch{}, false)
	return wt
}

// popping is called just before the waiter queues a pop, with the commit
// index read before it: wakes received until then are covered by that pop
// and are dropped, and later wakes of changes in the entries up to the
// index are not passed on.
func (wt *waiter) popping(commit uint64) {
	if wt.q != nil {
		wt.queued = wt.q.queued.Load()
	}
	wt.covered.Store(state.Position(commit + 1))
	select {
	case <-wt.ch:
	default:
	}
}

// popped notes the result of a long poll's pop of group in queue k, at
// position at, proposed under epoch: the waiter is covered up to it, and
// it becomes the group's mark if it is the latest.
func (w *waiters) popped(k state.Wake, group string, wt *waiter, at uint64, drained bool, epoch popEpoch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if at > wt.covered.Load() {
		wt.covered.Store(at)
	}
	q := w.queues[k]
	if q == nil {
		return
	}
	if mk, ok := q.groups[group]; !ok || at > mk.at {
		q.groups[group] = popMark{at: at, drained: drained, epoch: epoch, queued: wt.queued}
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

// wake is the node's wake (cluster.Config.OnWake): the changes that woke
// ks[i] are at or below position at[i] (math.MaxUint64: not applied yet).
func (w *waiters) wake(ks []state.Wake, at []uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, k := range ks {
		pos := uint64(math.MaxUint64)
		if i < len(at) {
			pos = at[i]
		}
		if q := w.queues[k]; q != nil && pos != math.MaxUint64 && pos > q.woke {
			// An early wake is not kept: the state machine's wake of the
			// same push follows it.
			q.woke = pos
		}
		w.signalLocked(k, pos)
	}
}

// wakeQueued wakes the waiters of ks for a push queued for the log on
// this node and not yet applied: every waiter looks again.
func (w *waiters) wakeQueued(ks []state.Wake) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range ks {
		if q := w.queues[k]; q != nil {
			q.queued.Add(1)
		}
		w.signalLocked(k, math.MaxUint64)
	}
}

func (w *waiters) signalLocked(k state.Wake, pos uint64) {
	for wt := range w.m[k] {
		if pos < wt.covered.Load() {
			continue
		}
		select {
		case wt.ch <- struct{}{}:
		default:
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
