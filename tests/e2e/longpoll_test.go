package e2e

import (
	"fmt"
	"testing"
	"time"
)

func TestLongPoll(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	t.Run("WokenByPush", func(t *testing.T) {
		t.Parallel()
		q := "lp-wake"
		const iterations = 50
		var lat []time.Duration
		for i := 0; i < iterations; i++ {
			pushed := make(chan time.Time, 1)
			errc := make(chan error, 1)
			go func() {
				time.Sleep(200 * time.Millisecond)
				at := time.Now()
				r, err := s.roundTrip("POST", "/api/v1/push", M{"items": []pushItem{{Queue: q, Payload: M{"i": i}}}})
				if err == nil && r.Status != 201 {
					err = fmt.Errorf("push:\n%s", r)
				}
				pushed <- at
				errc <- err
			}()
			start := time.Now()
			p, r, err := s.tryPop(popPath(q, "wait=true&timeout=5000&autoAck=true"))
			returned := time.Now()
			if err != nil {
				t.Fatalf("iteration %d: %v", i, err)
			}
			if perr := <-errc; perr != nil {
				t.Fatalf("iteration %d: %v", i, perr)
			}
			at := <-pushed
			if p == nil {
				t.Fatalf("iteration %d: long poll returned 204 after %v although a message was pushed after 200 ms\n%s", i, returned.Sub(start), r)
			}
			if got := dataInts(t, p.Messages); !intsEqual(got, []int{i}) {
				t.Fatalf("iteration %d: got %v", i, got)
			}
			if returned.Sub(start) >= 5*time.Second {
				t.Errorf("iteration %d: the pop returned after %v, at its timeout", i, returned.Sub(start))
			}
			lat = append(lat, returned.Sub(at))
		}
		t.Logf("long-poll wake latency (push sent → pop returned) over %d: p50 %v, p99 %v, max %v",
			len(lat), percentile(lat, 50), percentile(lat, 99), percentile(lat, 100))
	})

	// A new named group (default mode "new") that long-polls gets the
	// messages pushed while it waits: its start is fixed by its first pop.
	// Both when the queue exists and when the push creates it (the Queen
	// reading: the group subscribes when it first asks, queue or not).
	for _, exists := range []bool{true, false} {
		t.Run(fmt.Sprintf("WokenInNewGroup/queueExists=%v", exists), func(t *testing.T) {
			t.Parallel()
			q := fmt.Sprintf("lp-group-%v", exists)
			if exists {
				s.configure(t, M{"queue": q})
			}
			go func() {
				time.Sleep(200 * time.Millisecond)
				s.roundTrip("POST", "/api/v1/push", M{"items": []pushItem{{Queue: q, Payload: M{"i": 1}}}})
			}()
			start := time.Now()
			p := s.pop(t, q, "consumerGroup=waiter&wait=true&timeout=3000")
			if p == nil {
				t.Fatalf("GET %s: 204 after %v; the message pushed 200 ms into the wait was not delivered",
					popPath(q, "consumerGroup=waiter&wait=true&timeout=3000"), time.Since(start).Round(time.Millisecond))
			}
			if dataInts(t, p.Messages)[0] != 1 {
				t.Errorf("got %s", p.Messages[0].Data)
			}
		})
	}

	t.Run("TimeoutGives204", func(t *testing.T) {
		t.Parallel()
		q := "lp-empty"
		s.pushN(t, "lp-other-queue", "p", 1) // a push elsewhere does not answer it
		start := time.Now()
		go func() {
			time.Sleep(300 * time.Millisecond)
			s.roundTrip("POST", "/api/v1/push", M{"items": []pushItem{{Queue: "lp-other-queue", Payload: 1}}})
		}()
		s.mustEmpty(t, q, "wait=true&timeout=2000")
		el := time.Since(start)
		if el < 1900*time.Millisecond || el > 6*time.Second {
			t.Errorf("long poll with timeout=2000 on an empty queue returned 204 after %v", el)
		}
		t.Logf("empty long poll (timeout 2000 ms) returned after %v", el.Round(time.Millisecond))
	})

	t.Run("NoWaitIsImmediate", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		s.mustEmpty(t, "lp-nowait", "timeout=5000")
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("a pop without wait=true took %v", el)
		}
	})
}
