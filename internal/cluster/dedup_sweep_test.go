package cluster

import (
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// An idle node drops the results of old requests: without new writes the
// index would keep them (and their memory) for good.
func TestDedupSweepDropsOldResultsWhenIdle(t *testing.T) {
	d := newDedup(1, 0)
	ids := []reqID{newReqID(), newReqID()}
	d.record(5, ids, []any{&state.PushResult{}, &state.PushResult{}}, false)
	d.sweepOnce(time.Now())
	if len(d.applied) != 2 {
		t.Fatalf("fresh results swept: %d left, want 2", len(d.applied))
	}
	d.sweepOnce(time.Now().Add(dedupMaxAge + time.Second))
	if len(d.applied) != 0 || d.order.Len() != 0 || d.bytes != 0 {
		t.Fatalf("after %v idle: %d results, %d in order, %d bytes; want none", dedupMaxAge, len(d.applied), d.order.Len(), d.bytes)
	}
	// A retry whose original may sit at index 5 is no longer covered.
	if d.covers(4) || !d.covers(5) {
		t.Errorf("coverage after the sweep: covers(4)=%v covers(5)=%v; want only entries after the dropped ones", d.covers(4), d.covers(5))
	}
}
