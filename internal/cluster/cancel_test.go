package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A caller that gives up while its command is in flight gets its own
// context's error back, not "the leader changed": no leader changed.
func TestCancelledInFlightIsNotALeaderChange(t *testing.T) {
	tc := startCluster(t, 3)
	for _, n := range []*Node{tc.leader(), tc.follower()} {
		cancelled := 0
		for i := 0; i < 20 && cancelled < 3; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			// On the leader, cancel once the command is queued for the log;
			// on a follower, at once (the forward is then in flight or
			// refused before it was sent).
			var cctx context.Context = OnQueued(ctx, cancel)
			if !n.IsLeader() {
				go cancel()
			}
			_, err := n.Submit(cctx, kvPut("k", "v", nil), 16)
			cancel()
			if err == nil {
				continue // applied before the cancellation was seen
			}
			cancelled++
			if errors.Is(err, ErrOutcomeUnknown) || strings.Contains(err.Error(), "leader changed") {
				t.Fatalf("%s: cancelled request reported as a leader change: %v", n.ID(), err)
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%s: cancelled request: %v; want it to wrap context.Canceled", n.ID(), err)
			}
		}
		if cancelled == 0 {
			t.Fatalf("%s: no attempt was cancelled in flight in 20 tries", n.ID())
		}
	}
}
