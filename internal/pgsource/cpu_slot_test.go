package pgsource

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/connector"
)

// TestCPUSlotFreeWhileHanding: the reader does not keep the node's CPU
// slot while it waits to hand a bundle to a committer that is full: with
// the committer stuck and its queue full, another connector can take the
// only slot, again and again.
func TestCPUSlotFreeWhileHanding(t *testing.T) {
	s, db := ordersSource(t)
	s.Exec(t, db, "CREATE TABLE cpu (id int PRIMARY KEY)")
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "cpu", connector.TableSpec{Table: "public.cpu", Queue: "cpu"})
	doc.Source.Snapshot = "never"
	doc.Source.MaxBundleMessages = 10
	release := make(chan struct{})
	var handed atomic.Int32
	h := &hooks{
		handed: func(n int, _ *pointer) {
			if n > 0 {
				handed.Add(1)
			}
		},
		beforeCommit: func(n int, _ *pointer) error {
			if n > 0 {
				<-release
			}
			return nil
		},
	}
	pool := connector.NewPool(1)
	src := startSourceEnv(t, connector.Env{Broker: b, Tenant: "default", Doc: doc, NodeID: "n1", AllowPrivateNetworks: true, CPU: pool}, h)
	defer close(release)
	src.waitPhase(t, connector.PhaseStreaming)
	// One bundle stuck in the committer, two queued, and more rows the
	// reader must hand over next.
	for i := 0; i < 6; i++ {
		s.Exec(t, db, fmt.Sprintf("INSERT INTO cpu SELECT g FROM generate_series(%d, %d) g", 1+10*i, 10+10*i))
	}
	if err := waitFor(func() error {
		if n := handed.Load(); n < 1+queueBundles {
			return fmt.Errorf("%d bundles handed", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The reader is now blocked handing the next bundle over (or about
	// to be); the slot must be free.
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := pool.Acquire(ctx)
		cancel()
		if err != nil {
			t.Fatalf("attempt %d: the CPU slot is held while the reader waits for the committer", i)
		}
		pool.Release()
		time.Sleep(10 * time.Millisecond)
	}
}
