package pgsink

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// TestAcksRideOnPops: the acks of durable batches go with the next pop
// (broker.PopRequest.Acks), the table holds every message once, and no
// message comes back (nothing is skipped: every ack was applied, none
// lost).
func TestAcksRideOnPops(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	b := openBroker(t)
	const n = 6000
	pushNumbered(t, b, "nums", 4, 0, n)
	spec := sinkSpec("nums", "public.nums", "append")
	spec.Batch, spec.Workers = 200, 2
	r := startSink(t, b, "nums", db, spec)
	exactlyOnce(t, db, n)
	waitFor(t, "every message acked", 30*time.Second, func() error {
		if got := r.metrics.applied.get(); got != n {
			return fmt.Errorf("acked as applied: %v", got)
		}
		return nil
	})
	if c := r.sink.carried.Load(); c == 0 {
		t.Fatalf("no ack rode on a pop (%d alone)", r.sink.acksAlone.Load())
	}
	if sk := r.metrics.skipped.get(); sk != 0 {
		t.Fatalf("%v messages came back and were skipped", sk)
	}
	t.Logf("acks with a pop %d, alone %d", r.sink.carried.Load(), r.sink.acksAlone.Load())
}

// TestCarriedAckFails: a pop loop fails the acks handed to it, at random.
// Reported as not sent (broker.ErrAckNotSent), they go again on their own
// and nothing comes back; reported as failed otherwise, they are lost as
// a failed ack is: the messages come back after the lease and the progress
// rows skip them. Either way the table holds every message once.
func TestCarriedAckFails(t *testing.T) {
	for _, notSent := range []bool{true, false} {
		t.Run(fmt.Sprintf("notSent=%t", notSent), func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			var mu sync.Mutex
			var failed atomic.Int64
			faultCarry = func() error {
				mu.Lock()
				defer mu.Unlock()
				if rng.IntN(2) != 0 {
					return nil
				}
				failed.Add(1)
				if notSent {
					return fmt.Errorf("%w: injected", broker.ErrAckNotSent)
				}
				return errors.New("injected: the combined call failed")
			}
			t.Cleanup(func() { faultCarry = nil })
			db := newDB(t)
			exec(t, db, `CREATE TABLE nums (n int, pad text)`)
			b := openBroker(t)
			const n = 6000
			pushNumbered(t, b, "nums", 4, 0, n)
			spec := sinkSpec("nums", "public.nums", "append")
			spec.Batch, spec.Workers, spec.LeaseSeconds = 200, 2, 5
			r := startSink(t, b, "nums", db, spec)
			exactlyOnce(t, db, n)
			waitFor(t, "failed carried acks", 30*time.Second, func() error {
				if failed.Load() == 0 {
					return errors.New("no carried ack failed yet")
				}
				return nil
			})
			if notSent {
				waitFor(t, "every message acked", 30*time.Second, func() error {
					if got := r.metrics.applied.get(); got != n {
						return fmt.Errorf("acked as applied: %v", got)
					}
					return nil
				})
				if sk := r.metrics.skipped.get(); sk != 0 {
					t.Fatalf("%v messages came back although their acks were sent again", sk)
				}
			} else {
				waitFor(t, "redeliveries skipped", 60*time.Second, func() error {
					if r.metrics.skipped.get() == 0 {
						return errors.New("nothing skipped yet")
					}
					return nil
				})
			}
			exactlyOnce(t, db, n)
			if r.metrics.dlq.get() != 0 {
				t.Fatalf("dead letters: %v", r.metrics.dlq.get())
			}
			t.Logf("failed %d carried acks; with a pop %d, alone %d; skipped %v", failed.Load(), r.sink.carried.Load(), r.sink.acksAlone.Load(), r.metrics.skipped.get())
		})
	}
}
