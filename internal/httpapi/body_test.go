package httpapi

import (
	"testing"
	"time"
)

// TestBodyBudgetHandsBack: a burst of 64 MiB or more is handed back to the
// OS once it is over, a second burst soon after as well (once the interval
// has passed), and small traffic never.
func TestBodyBudgetHandsBack(t *testing.T) {
	b := newBodyBudget(256 << 20)
	freed := make(chan time.Time, 4)
	b.freeOS = func() { freed <- time.Now() }
	b.interval = 500 * time.Millisecond
	burst := func() {
		for i := 0; i < 4; i++ {
			if !b.tryAcquire(32 << 20) {
				t.Fatalf("acquire %d of 4 x 32 MiB failed under a 256 MiB limit", i)
			}
		}
		if b.tryAcquire(129 << 20) {
			t.Fatalf("acquired past the limit")
		}
		for i := 0; i < 4; i++ {
			b.release(32 << 20)
		}
	}
	for i := 0; i < 100; i++ { // small bodies: no hand-back
		b.tryAcquire(1 << 20)
		b.release(1 << 20)
	}
	start := time.Now()
	burst()
	select {
	case <-freed:
	case <-time.After(5 * time.Second):
		t.Fatalf("no hand-back after a 128 MiB burst")
	}
	// Wait until the first hand-back is recorded, then burst again: the
	// second comes after the interval, not never.
	for {
		b.mu.Lock()
		done := !b.freeing
		b.mu.Unlock()
		if done {
			break
		}
		time.Sleep(time.Millisecond)
	}
	burst()
	select {
	case at := <-freed:
		if at.Sub(start) < b.interval {
			t.Errorf("second hand-back after %v, want no sooner than %v", at.Sub(start), b.interval)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no hand-back after a second burst")
	}
	if n := b.inUse(); n != 0 {
		t.Fatalf("%d bytes still counted", n)
	}
}
