package cluster

import (
	"context"
	"time"
)

// backoff paces retries: 5 ms doubling to 100 ms.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 5 * time.Millisecond} }

// wait sleeps the next interval; false when ctx ended or the node closes.
func (b *backoff) wait(ctx context.Context, closing <-chan struct{}) bool {
	t := time.NewTimer(b.d)
	defer t.Stop()
	if b.d < 100*time.Millisecond {
		b.d *= 2
	}
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	case <-closing:
		return false
	}
}
