package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// A snapshot due by the log's bytes first flushes the store's memtables
// while entries go on being applied: a push is answered while that flush
// is held, no snapshot is taken before it ends, and the snapshot follows
// once it does. Before, the apply thread took the checkpoint with the
// whole memtable still to flush, and every write waited for that flush.
func TestSnapshotFlushesBeforeTheApplyWaits(t *testing.T) {
	tc := startClusterWith(t, 1, func(_ int, c *Config) {
		c.SnapshotLogBytes = 1 << 20
		c.SnapshotInterval = time.Hour
	})
	n := tc.leader()
	entered, release := make(chan state.WriteStats, 1), make(chan struct{})
	n.preflushed = func() {
		entered <- n.Store().WriteStats()
		<-release
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	ctx := ctxT(t, 60*time.Second)
	push := func(i int, payload []byte) {
		t.Helper()
		v, err := n.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: fmt.Sprintf("t%d", i), Payload: payload}}}, 64)
		if err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
		if r, ok := v.(*state.PushResult); !ok || r.Err != nil {
			t.Fatalf("push %d: %T %+v", i, v, v)
		}
	}
	before := n.Store().WriteStats()
	payload := []byte(`"` + strings.Repeat("x", 64<<10) + `"`)
	i := 0
	var at state.WriteStats
	for waiting := true; waiting; {
		select {
		case at = <-entered:
			waiting = false
		default:
			if i > 64 {
				t.Fatalf("%d pushes of 64 KiB and no snapshot under way (budget 1 MiB)", i)
			}
			push(i, payload)
			i++
		}
	}
	if at.Flushes <= before.Flushes {
		t.Fatalf("the memtable was not flushed before the snapshot was queued: %d flushes, %d before", at.Flushes, before.Flushes)
	}
	// Held between its flush and the apply thread: writes go on.
	for j := 0; j < 3; j++ {
		push(i, []byte(`"small"`))
		i++
	}
	if si := n.logs.snapshotIndex(); si != 0 {
		t.Fatalf("a snapshot at %d was taken before its flush was done", si)
	}
	close(release)
	released = true
	deadline := time.Now().Add(20 * time.Second)
	for n.logs.snapshotIndex() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no snapshot 20 s after its flush")
		}
		time.Sleep(10 * time.Millisecond)
	}
	rd := n.Store().Reader()
	defer rd.Close()
	if qi, ok := rd.Queue("default", "q"); !ok || qi.Total != int64(i) {
		t.Fatalf("queue q %v with %d messages, want %d", ok, qi.Total, i)
	}
	t.Logf("snapshot at %d after %d pushes; %d flushes before it was queued", n.logs.snapshotIndex(), i, at.Flushes-before.Flushes)
}
