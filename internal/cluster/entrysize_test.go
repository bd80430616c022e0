package cluster

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// Many large commands queued at once are proposed as entries of at most
// about maxEntryBytes each: raft-wal keeps a write buffer the size of the
// largest append of each segment still in the log, so an entry of many
// MiB would pin that much memory per segment (docs/operations.md).
func TestLargeCommandsSplitIntoBoundedEntries(t *testing.T) {
	tc := startClusterWith(t, 1, func(i int, c *Config) {
		c.SnapshotThreshold, c.SnapshotInterval = 1<<30, time.Hour
	})
	ctx := ctxT(t, 30*time.Second)
	l := tc.leader()
	const cmds, size = 48, 100 << 10
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	first, err := l.logs.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, cmds)
	for i := range cmds {
		wg.Go(func() {
			cmd := &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: "tx" + string(rune('A'+i)), Generated: true, Payload: payload}}}
			if _, err := l.Submit(ctx, cmd, size); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("push: %v", err)
	}
	last, err := l.logs.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	ents, err := l.logs.Entries(first+1, last+1, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	largest, pushes := 0, 0
	for _, e := range ents {
		largest = max(largest, len(e.GetData()))
		if len(e.GetData()) > size {
			pushes += len(e.GetData()) / size
		}
	}
	t.Logf("%d pushes of %d KiB in %d entries, the largest %d bytes", pushes, size>>10, len(ents), largest)
	if pushes < cmds {
		t.Fatalf("found %d pushes of %d bytes in the log, want %d", pushes, size, cmds)
	}
	// Two MiB is the buffer a segment then keeps (its largest write,
	// rounded up to a power of two).
	if limit := 2 << 20; largest > limit {
		t.Fatalf("an entry of %d bytes, want at most %d", largest, limit)
	}
}
