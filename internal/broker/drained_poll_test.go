package broker

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// waitParked waits until n long polls of key are registered and the log
// holds no entry that is not applied (their pops, if any, are in).
func waitParked(t *testing.T, b *Broker, key state.Wake, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.waiters.mu.Lock()
		got := len(b.waiters.m[key])
		b.waiters.mu.Unlock()
		if got == n && b.Node().Store().AppliedIndex() == b.Node().CommitIndex() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d long polls parked, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// noEntryFor checks that the log gets no entry for d.
func noEntryFor(t *testing.T, b *Broker, d time.Duration, what string) {
	t.Helper()
	at := b.Node().CommitIndex()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if c := b.Node().CommitIndex(); c != at {
			t.Fatalf("%s: the log went from %d to %d entries", what, at, c)
		}
	}
}

// TestDrainedGroupPollParksWithoutPop: a long poll of a group whose last
// long poll took everything it had parks without writing a pop to the log;
// the next push wakes it and it delivers. The very first poll of a group
// pops (it creates the group), and a poll after one that left messages
// behind pops and gets them at once.
func TestDrainedGroupPollParksWithoutPop(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	key := state.Wake{Tenant: "default", Queue: "dr"}
	poll := func(batch int) <-chan *PopResponse {
		ch := make(chan *PopResponse, 1)
		go func() {
			r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "dr", Group: "g", Batch: batch, AutoAck: true, Wait: true, Timeout: 30 * time.Second})
			if err != nil {
				t.Error(err)
			}
			ch <- r
		}()
		return ch
	}
	push := func(vals ...string) {
		t.Helper()
		items := make([]PushItem, len(vals))
		for i, v := range vals {
			items[i] = PushItem{Queue: "dr", Partition: "p", Payload: []byte(v)}
		}
		if _, err := b.Push(ctx, "default", items); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(ch <-chan *PopResponse, want ...string) {
		t.Helper()
		select {
		case r := <-ch:
			if r == nil || len(r.Messages) != len(want) {
				t.Fatalf("got %+v, want %v", r, want)
			}
			for i, m := range r.Messages {
				if string(m.Data) != want[i] {
					t.Fatalf("message %d is %s, want %s", i, m.Data, want[i])
				}
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("no delivery of %v (a poll waits 30 s)", want)
		}
	}
	// The group's first poll pops: the group is created at the end of the
	// queue, so the push after it is delivered.
	start := b.Node().CommitIndex()
	ch := poll(10)
	for deadline := time.Now().Add(10 * time.Second); b.Node().CommitIndex() == start; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the group's first long poll wrote no pop")
		}
	}
	waitParked(t, b, key, 1)
	push("1")
	recv(ch, "1")
	// Its pop took everything: the next poll parks at once. A push counted
	// on this node while the delivering pop was being queued (the poll
	// woken again by its own first pop's wake, say) makes the next poll
	// pop once, as it must when it cannot tell the order; so up to three
	// rounds, each delivering, until one parks.
	for round := 1; ; round++ {
		skipped := b.waiters.parkedFirst.Load()
		ch = poll(10)
		waitParked(t, b, key, 1)
		noEntryFor(t, b, 200*time.Millisecond, "a poll of a drained group")
		parked := b.waiters.parkedFirst.Load() == skipped+1
		v := strconv.Itoa(100 + round)
		push(v, v+"b")
		recv(ch, v, v+"b")
		if parked {
			break
		}
		if round == 3 {
			t.Fatal("in three rounds the poll of a drained group never parked at once")
		}
		t.Logf("round %d: the poll after a delivery popped before it parked; again", round)
	}
	// A push between the drained pop and the next poll: that poll pops.
	push("x")
	skipped := b.waiters.parkedFirst.Load()
	recv(poll(10), "x")
	if b.waiters.parkedFirst.Load() != skipped {
		t.Fatal("a poll after a push that followed the drained pop parked without popping")
	}
	// A pop that leaves messages behind is not drained: the next poll pops.
	ch = poll(1)
	waitParked(t, b, key, 1)
	push("4", "5")
	recv(ch, "4")
	skipped = b.waiters.parkedFirst.Load()
	recv(poll(1), "5")
	if b.waiters.parkedFirst.Load() != skipped {
		t.Fatal("a poll after a pop that left a message parked without popping")
	}
}

// TestPollAfterGroupDeletedPops: a group deleted after its last long poll
// drained it is created again by the next poll's pop (at the end of the
// queue, as subscriptionMode new says), so that poll gets the push that
// follows it; a poll that parked without popping would create the group
// only when that push woke it, after the push.
func TestPollAfterGroupDeletedPops(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	key := state.Wake{Tenant: "default", Queue: "del"}
	pollOnce := func(timeout time.Duration) <-chan *PopResponse {
		ch := make(chan *PopResponse, 1)
		go func() {
			r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "del", Group: "g", Batch: 10, AutoAck: true, Wait: true, Timeout: timeout})
			if err != nil {
				t.Error(err)
			}
			ch <- r
		}()
		return ch
	}
	// A poll that finds the group drained and times out leaves its mark.
	r := <-pollOnce(50 * time.Millisecond)
	if r == nil || len(r.Messages) != 0 {
		t.Fatalf("first poll: %+v", r)
	}
	if n, err := b.DeleteGroup(ctx, "default", "g", "del"); err != nil || n != 1 {
		t.Fatalf("delete group: %d, %v", n, err)
	}
	deleted := b.Node().CommitIndex()
	ch := pollOnce(30 * time.Second)
	for deadline := time.Now().Add(10 * time.Second); b.Node().CommitIndex() == deleted; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the poll after the group's deletion wrote no pop")
		}
	}
	waitParked(t, b, key, 1)
	if _, err := b.Push(ctx, "default", []PushItem{{Queue: "del", Partition: "p", Payload: []byte(`1`)}}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r == nil || len(r.Messages) != 1 {
			t.Fatalf("the poll after the group's deletion got %+v, want the push", r)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the poll after the group's deletion missed the push")
	}
}

// TestDrainedPollsMissNoMessage races pushes against long polls that park
// without popping: several producers push at random gaps (often none) to a
// few partitions while two groups of two consumers and a queue-mode pair
// long-poll with random batches, some leasing and acknowledging after a
// random pause. Every group must get every message exactly once, long
// before any poll's timeout; trials log their seeds.
func TestDrainedPollsMissNoMessage(t *testing.T) {
	// The longer the gaps between pushes, the more polls park without
	// popping; the shorter, the more pushes land between a pop and a park.
	for trial, gap := range []time.Duration{300 * time.Microsecond, 1500 * time.Microsecond, 5 * time.Millisecond, 20 * time.Millisecond} {
		seed := uint64(time.Now().UnixNano()) + uint64(trial)
		t.Logf("trial %d seed %d, gaps up to %v", trial, seed, gap)
		drainedRace(t, seed, gap)
	}
}

func drainedRace(t *testing.T, seed uint64, gap time.Duration) {
	b := openBroker(t)
	queue := "race" + strconv.FormatUint(seed%1000, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const producers, each = 3, 80
	groups := []string{"", "g1", "g2"}
	type tally struct {
		mu   sync.Mutex
		seen map[string]int
	}
	tallies := make([]*tally, len(groups))
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	var pops atomic.Int64
	for gi, g := range groups {
		tallies[gi] = &tally{seen: map[string]int{}}
		for c := range 2 {
			rng := rand.New(rand.NewPCG(seed, uint64(100+gi*10+c)))
			autoAck := c == 0 || g == ""
			wg.Go(func() {
				for ctx.Err() == nil {
					r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: queue, Group: g, Batch: 1 + rng.IntN(4), Partitions: 1 + rng.IntN(2),
						AutoAck: autoAck, SubscriptionMode: "all", Wait: true, Timeout: 30 * time.Second})
					if err != nil {
						if ctx.Err() == nil {
							errs <- err
						}
						return
					}
					pops.Add(1)
					tl := tallies[gi]
					tl.mu.Lock()
					for _, m := range r.Messages {
						tl.seen[string(m.Data)]++
					}
					tl.mu.Unlock()
					if !autoAck && len(r.Messages) > 0 {
						if rng.IntN(2) == 0 {
							time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
						}
						items := make([]AckItem, len(r.Messages))
						for i, m := range r.Messages {
							items[i] = AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: g, LeaseID: m.LeaseID}
						}
						if _, err := b.Ack(ctx, "default", items); err != nil && ctx.Err() == nil {
							errs <- err
							return
						}
					}
					if rng.IntN(3) == 0 {
						time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
					}
				}
			})
		}
	}
	var pw sync.WaitGroup
	for p := range producers {
		rng := rand.New(rand.NewPCG(seed, uint64(p)))
		pw.Go(func() {
			for i := 0; i < each; {
				if rng.IntN(3) > 0 {
					time.Sleep(time.Duration(rng.Int64N(int64(gap))))
				}
				n := min(1+rng.IntN(3), each-i)
				items := make([]PushItem, n)
				for j := range items {
					items[j] = PushItem{Queue: queue, Partition: "p" + strconv.Itoa(rng.IntN(3)), Payload: strconv.AppendInt(nil, int64(p*each+i+j), 10)}
				}
				if _, err := b.Push(ctx, "default", items); err != nil {
					errs <- err
					return
				}
				i += n
			}
		})
	}
	pw.Wait()
	deadline := time.Now().Add(15 * time.Second)
	for {
		done := true
		for gi, tl := range tallies {
			tl.mu.Lock()
			n := len(tl.seen)
			for v, k := range tl.seen {
				if k != 1 {
					tl.mu.Unlock()
					t.Fatalf("seed %d: group %q got message %s %d times", seed, groups[gi], v, k)
				}
			}
			tl.mu.Unlock()
			if n < producers*each {
				done = false
				if time.Now().After(deadline) {
					t.Fatalf("seed %d: group %q has %d of %d messages 15 s after the last push (a poll waits 30 s: a wake was missed)", seed, groups[gi], n, producers*each)
				}
			}
		}
		if done {
			break
		}
		select {
		case err := <-errs:
			t.Fatalf("seed %d: %v", seed, err)
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	t.Logf("seed %d: %d messages to each of %d groups in %d pops; %d polls parked without popping", seed, producers*each, len(groups), pops.Load(), b.waiters.parkedFirst.Load())
}

// TestParkedPollWokenByLaterChange: a poll parked on a drained group's mark
// is covered up to the drained pop: the wake of a change after that pop
// (sent before the park, or after it) sends it to pop, one of a change
// before it does not; a mark made under another leadership, or before a
// group was deleted, or before a push was queued on this node, is not
// trusted; a poll of one partition always pops.
func TestParkedPollWokenByLaterChange(t *testing.T) {
	w := newWaiters()
	k := state.Wake{Tenant: "t", Queue: "q"}
	ep := popEpoch{term: 3, drops: 1}
	at := state.Position(20) + 1
	mark := func(drained bool) {
		wt := w.add(k)
		w.popped(k, "g", wt, at, drained, ep)
		w.remove(k, wt)
	}
	mark(true)
	for _, c := range []struct {
		name  string
		epoch popEpoch
		group string
		any   bool
	}{
		{"another term", popEpoch{term: 4, drops: 1}, "g", true},
		{"not leading", popEpoch{drops: 1}, "g", true},
		{"a group deleted since", popEpoch{term: 3, drops: 2}, "g", true},
		{"another group", ep, "h", true},
		{"one partition", ep, "g", false},
	} {
		wt, parked := w.park(k, c.group, c.epoch, c.any)
		w.remove(k, wt)
		if parked {
			t.Fatalf("%s: the poll parked without popping", c.name)
		}
	}
	wt, parked := w.park(k, "g", ep, true)
	if !parked {
		t.Fatal("the poll of a drained group popped")
	}
	w.wake([]state.Wake{k}, []uint64{state.Position(20)})
	if signalled(wt) {
		t.Fatal("a wake of a change before the drained pop woke the parked poll")
	}
	w.wake([]state.Wake{k}, []uint64{state.Position(20) + 2})
	if !signalled(wt) {
		t.Fatal("a wake of a change after the drained pop, in its entry, did not wake the parked poll")
	}
	w.remove(k, wt)
	// That wake came before the next park: the next poll pops.
	wt, parked = w.park(k, "g", ep, true)
	w.remove(k, wt)
	if parked {
		t.Fatal("a poll after a wake of a change after the drained pop parked without popping")
	}
	// A later pop that leaves work replaces the mark; an earlier result
	// arriving late does not.
	at = state.Position(30)
	mark(true)
	at = state.Position(31)
	mark(false)
	at = state.Position(29)
	mark(true)
	wt, parked = w.park(k, "g", ep, true)
	w.remove(k, wt)
	if parked {
		t.Fatal("a poll parked on an older mark than the group's last pop")
	}
	// A push queued on this node after the drained pop was queued may be
	// in the log after it, not applied yet: the next poll pops.
	at = state.Position(40)
	mark(true)
	wt, parked = w.park(k, "g", ep, true)
	w.remove(k, wt)
	if !parked {
		t.Fatal("the poll of a drained group popped")
	}
	w.wakeQueued([]state.Wake{k})
	wt, parked = w.park(k, "g", ep, true)
	w.remove(k, wt)
	if parked {
		t.Fatal("a poll after a push queued since the drained pop parked without popping")
	}
}
