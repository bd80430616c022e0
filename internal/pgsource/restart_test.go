package pgsource

import (
	"context"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

// supervise runs the source of doc as the connector runtime does: when Run
// fails it is started again after a short backoff, until the test ends.
func supervise(t *testing.T, b *broker.Broker, doc connector.Document) (stop func(), runs func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			env := connector.Env{Broker: b, Tenant: "default", Doc: doc, NodeID: "n1", AllowPrivateNetworks: true,
				Status: connector.NewStatusReporter(connector.PhaseConnecting), Metrics: nopMetrics()}
			rn, err := New(env)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
			if err := rn.Run(ctx); err != nil {
				t.Logf("run failed, starting again: %v", err)
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// TestPostgresRestart: PostgreSQL restarts while a writer changes rows and
// the source streams them; the source reconnects and every change arrives
// exactly once, in order per key.
func TestPostgresRestart(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	s := pgtest.Private(t, pgtest.Options{})
	s.Exec(t, "postgres", `CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT g, 0 FROM generate_series(1, 300) g`)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, "postgres", "restart", connector.TableSpec{Table: "public.t", Queue: "t"})
	_, runs := supervise(t, b, doc)
	if err := waitFor(func() error {
		_, ok, err := b.KVGet(context.Background(), "default", connector.PointerKey("restart"))
		if err == nil && !ok {
			err = errString("no pointer yet")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	final, inserted := map[int]int{}, map[int]int{}
	// Two write loads with a restart between them; a restart inside a
	// load would fail the writer's own transaction.
	if err := writeLoad(s.URL("postgres"), rand.New(rand.NewSource(rng.Int63())), final, inserted); err != nil {
		t.Fatal(err)
	}
	s.Restart(t)
	second := map[int]int{}
	if err := writeLoad(s.URL("postgres"), rand.New(rand.NewSource(rng.Int63())), second, map[int]int{}); err != nil {
		t.Fatal(err)
	}
	for k, v := range second {
		final[k] += v
	}
	s.Exec(t, "postgres", `INSERT INTO t VALUES (999999, 0)`)
	evs := drainUntil(t, b, "t", "check", "999999")
	// The second load's inserts reuse the first's ids after their
	// deletes; check the original rows, which carry the history.
	checkOriginal(t, evs, final)
	if runs() < 2 {
		t.Fatalf("the source ran %d times; the restart should have broken its connections", runs())
	}
}

// checkOriginal is checkHistory for the original keys 1..300 only.
func checkOriginal(t *testing.T, evs []got, final map[int]int) {
	t.Helper()
	var orig []got
	for _, g := range evs {
		if len(g.msg.Partition) <= 3 {
			orig = append(orig, g)
		}
	}
	checkHistory(t, orig, final, map[int]int{})
}
