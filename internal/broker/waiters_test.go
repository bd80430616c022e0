package broker

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/state"
)

func signalled(wt *waiter) bool {
	select {
	case <-wt.ch:
		return true
	default:
		return false
	}
}

// TestWakeCoveredByThePopIsDropped: a state machine's wake of a change in
// the entries up to the commit index read before the waiter's pop was
// queued, or before the position of the pop's own result, does not send it
// round again (that pop saw the change); a later change, a push queued for
// the log, and the broker's closing do; and wakes received before a pop is
// queued are dropped by it.
func TestWakeCoveredByThePopIsDropped(t *testing.T) {
	w := newWaiters()
	k := state.Wake{Tenant: "t", Queue: "q"}
	other := state.Wake{Tenant: "t", Queue: "other"}
	wake := func(k state.Wake, index, cmd uint64) { w.wake([]state.Wake{k}, []uint64{state.Position(index) + cmd}) }
	wt := w.add(k)
	wt.popping(10)

	wake(k, 10, 5)
	if signalled(wt) {
		t.Fatal("a wake of a change at the index the pop covered sent it round again")
	}
	wake(other, 11, 0)
	if signalled(wt) {
		t.Fatal("a wake of another queue reached the waiter")
	}
	wake(k, 11, 0)
	if !signalled(wt) {
		t.Fatal("a wake of a change after the pop's commit index was dropped")
	}
	// The pop's result puts it at entry 12, command 3: a change before it
	// was seen, one after it was not.
	w.popped(k, "", wt, state.Position(12)+3, false, popEpoch{})
	wake(k, 12, 2)
	if signalled(wt) {
		t.Fatal("a wake of a change before the pop's position sent it round again")
	}
	wake(k, 12, 4)
	if !signalled(wt) {
		t.Fatal("a wake of a change after the pop in its own entry was dropped")
	}
	// A push queued for the log is not applied: the waiter looks again.
	w.wakeQueued([]state.Wake{k})
	if !signalled(wt) {
		t.Fatal("a push queued for the log did not wake the waiter")
	}
	w.wake([]state.Wake{k}, []uint64{math.MaxUint64})
	if !signalled(wt) {
		t.Fatal("the leader's wake of a push it put in its log did not wake the waiter")
	}
	// A wake received before the next pop is queued is covered by it.
	wake(k, 50, 0)
	wt.popping(60)
	if signalled(wt) {
		t.Fatal("a wake received before the pop was queued survived it")
	}
	w.remove(k, wt)
	w.wakeQueued([]state.Wake{k})
	if signalled(wt) {
		t.Fatal("a removed waiter was woken")
	}
	wt2 := w.add(k)
	wt2.popping(1 << 40)
	w.closeAll()
	if !signalled(wt2) {
		t.Fatal("closing did not wake a waiter whose pop covers everything")
	}
}

// TestLongPollsMissNoPush: one consumer long-polls (30 s timeout) while
// several producers push single messages at random gaps; every message is
// delivered long before any poll's timeout, so no wake a poll needed was
// dropped.
func TestLongPollsMissNoPush(t *testing.T) {
	b := openBroker(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const producers, each = 4, 100
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		pops atomic.Int64
	)
	errs := make(chan error, producers+1)
	go func() {
		for ctx.Err() == nil {
			r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "miss", Batch: 7, AutoAck: true, Wait: true, Timeout: 30 * time.Second})
			if err != nil {
				if ctx.Err() == nil {
					errs <- err
				}
				return
			}
			pops.Add(1)
			mu.Lock()
			for _, m := range r.Messages {
				if seen[string(m.Data)] {
					errs <- errDup(string(m.Data))
				}
				seen[string(m.Data)] = true
			}
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	for p := range producers {
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(p)))
		wg.Go(func() {
			for i := range each {
				if g := rng.IntN(4); g > 0 {
					time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
				}
				payload := strconv.AppendInt(nil, int64(p*each+i), 10)
				if _, err := b.Push(ctx, "default", []PushItem{{Queue: "miss", Partition: "p" + strconv.Itoa(rng.IntN(3)), Payload: payload}}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == producers*each {
			break
		}
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages delivered 15 s after the last push (a poll waits 30 s: a wake it needed was dropped)", n, producers*each)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("%d messages in %d pops", producers*each, pops.Load())
}

type errDup string

func (e errDup) Error() string { return "message " + string(e) + " delivered twice" }

// TestLongPollWokenByRetry: a message that a failed acknowledgement puts
// back wakes a long poll through the state machine's wake alone (no push
// wakes it early), long before the poll's timeout.
func TestLongPollWokenByRetry(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	if _, err := b.Push(ctx, "default", []PushItem{{Queue: "retry", Partition: "p", Payload: []byte(`1`)}}); err != nil {
		t.Fatal(err)
	}
	r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "retry"})
	if err != nil || len(r.Messages) != 1 {
		t.Fatalf("first pop: %v, %+v", err, r)
	}
	m := r.Messages[0]
	got := make(chan *PopResponse, 1)
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "retry", AutoAck: true, Wait: true, Timeout: 30 * time.Second})
		if err != nil {
			errc <- err
			return
		}
		got <- r
	}()
	// The poll is waiting once its empty pop is in (its waiter registered).
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.waiters.mu.Lock()
		n := len(b.waiters.m[state.Wake{Tenant: "default", Queue: "retry"}])
		b.waiters.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long poll never registered")
		}
		time.Sleep(time.Millisecond)
	}
	out, err := b.Ack(ctx, "default", []AckItem{{TxID: m.TxID, PartitionID: m.PartitionID, LeaseID: r.LeaseID, Status: "failed"}})
	if err != nil || len(out) != 1 || !out[0].Success {
		t.Fatalf("failed ack: %v, %+v", err, out)
	}
	select {
	case r := <-got:
		if len(r.Messages) != 1 || r.Messages[0].TxID != m.TxID {
			t.Fatalf("the long poll got %+v, want the retried message", r.Messages)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Fatalf("the retried message came after %v", el)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(15 * time.Second):
		t.Fatal("the long poll was not woken by the retried message (it waits 30 s)")
	}
}

// TestLateWakeOfADeliveredPushWritesNoPop: the state machine's wake of a
// push that a long poll's pop already saw (it comes after the pop was
// queued: the wake is sent once the push's batch is in Pebble) does not
// send the poll round for another, empty, pop: the log gets no entry until
// the next push, which the poll then delivers.
func TestLateWakeOfADeliveredPushWritesNoPop(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	key := state.Wake{Tenant: "default", Queue: "late"}
	if _, err := b.Push(ctx, "default", []PushItem{{Queue: "late", Partition: "p", Payload: []byte(`1`)}}); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "late", AutoAck: true}); err != nil || len(r.Messages) != 1 {
		t.Fatalf("pop: %v, %+v", err, r)
	}
	pushed := b.Node().Store().AppliedIndex() // at or above the push's index
	got := make(chan *PopResponse, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "late", AutoAck: true, Wait: true, Timeout: 30 * time.Second})
		if err != nil {
			errc <- err
			return
		}
		got <- r
	}()
	// Parked: registered, and its empty pop applied.
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.waiters.mu.Lock()
		n := len(b.waiters.m[key])
		b.waiters.mu.Unlock()
		if n == 1 && b.Node().Store().AppliedIndex() > pushed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long poll never parked")
		}
		time.Sleep(time.Millisecond)
	}
	parked := b.Node().CommitIndex()
	// The push's late wake, sent with a position in the entry at the
	// applied index before the poll.
	b.waiters.wake([]state.Wake{key}, []uint64{state.Position(pushed)})
	// A pop it sent round would be in the log within microseconds; give it
	// 300 ms.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if c := b.Node().CommitIndex(); c != parked {
			t.Fatalf("the late wake sent the poll round: the log went from %d to %d entries", parked, c)
		}
	}
	if _, err := b.Push(ctx, "default", []PushItem{{Queue: "late", Partition: "p", Payload: []byte(`2`)}}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if len(r.Messages) != 1 || string(r.Messages[0].Data) != "2" {
			t.Fatalf("the long poll got %+v, want message 2", r.Messages)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(15 * time.Second):
		t.Fatal("the long poll missed the next push")
	}
}

// TestFollowerLongPollSeesEveryPush: a consumer long-polling a follower
// (its pops forwarded to the leader, its wakes from the follower's own
// applies, its covered index the follower's commit index) gets every
// message pushed on the leader, long before a poll's timeout.
func TestFollowerLongPollSeesEveryPush(t *testing.T) {
	peers := make([]cluster.Peer, 3)
	for i := range peers {
		peers[i] = cluster.Peer{ID: fmt.Sprintf("n%d", i+1), Address: freeAddr(t)}
	}
	var brokers []*Broker
	for i := range peers {
		b, err := Open(Config{Cluster: cluster.Config{DataDir: t.TempDir(), NodeID: peers[i].ID, RaftAddr: peers[i].Address, Peers: peers}})
		if err != nil {
			t.Fatalf("open %s: %v", peers[i].ID, err)
		}
		t.Cleanup(func() { b.Close() })
		brokers = append(brokers, b)
	}
	var leader, follower *Broker
	deadline := time.Now().Add(20 * time.Second)
	for leader == nil {
		for _, b := range brokers {
			if h := b.Health(); h.Leader && h.Ready {
				leader = b
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no leader after 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, b := range brokers {
		if b != leader {
			follower = b
			break
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 50
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	errc := make(chan error, 2)
	go func() {
		for ctx.Err() == nil {
			r, err := follower.Pop(ctx, PopRequest{Tenant: "default", Queue: "fq", Batch: 10, AutoAck: true, Wait: true, Timeout: 30 * time.Second})
			if err != nil {
				if ctx.Err() == nil {
					errc <- err
				}
				return
			}
			mu.Lock()
			for _, m := range r.Messages {
				seen[string(m.Data)] = true
			}
			mu.Unlock()
		}
	}()
	for i := range n {
		if _, err := leader.Push(ctx, "default", []PushItem{{Queue: "fq", Partition: "p", Payload: strconv.AppendInt(nil, int64(i), 10)}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline = time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		got := len(seen)
		mu.Unlock()
		if got == n {
			return
		}
		select {
		case err := <-errc:
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower's consumer has %d of %d messages 15 s after the last push (a poll waits 30 s)", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
