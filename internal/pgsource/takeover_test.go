package pgsource

import (
	"errors"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/connector"
)

// TestTakeover: two nodes run one source; the second stands by while the
// first owns it. The first dies mid-stream without giving the lease back,
// and the second continues once the lease lapses; then the second stops
// gracefully and a third takes over at once. Every change arrives once, in
// order per key.
func TestTakeover(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	s, db := ordersSource(t)
	s.Exec(t, db, `CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT g, 0 FROM generate_series(1, 300) g`)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "take", connector.TableSpec{Table: "public.t", Queue: "t"})
	const ttl = 3 * time.Second
	var dying atomic.Bool
	one := startSource(t, b, doc, "n1", &hooks{leaseTTL: ttl, keepLease: true, beforeCommit: func(int, *pointer) error {
		if dying.Load() {
			return errCrash
		}
		return nil
	}})
	one.waitPhase(t, connector.PhaseStreaming)
	two := startSource(t, b, doc, "n2", &hooks{leaseTTL: ttl})
	two.waitPhase(t, connector.PhaseStandby)

	final, inserted := map[int]int{}, map[int]int{}
	writerDone := make(chan error, 1)
	wrng := rand.New(rand.NewSource(rng.Int63()))
	go func() { writerDone <- writeLoad(s.URL(db), wrng, final, inserted) }()
	time.Sleep(time.Duration(200+rng.Intn(400)) * time.Millisecond)
	dying.Store(true)
	if err := <-one.done; !errors.Is(err, errCrash) {
		t.Fatalf("the first owner ended with %v", err)
	}
	close(one.done)
	died := time.Now()
	two.waitPhase(t, connector.PhaseStreaming)
	if took := time.Since(died); took > ttl+ttl/3+2*time.Second {
		t.Fatalf("the standby took over after %v; the lease TTL is %v", took, ttl)
	} else {
		t.Logf("the standby took over %v after the owner died", took)
	}
	three := startSource(t, b, doc, "n3", &hooks{leaseTTL: ttl})
	three.waitPhase(t, connector.PhaseStandby)
	time.Sleep(time.Duration(rng.Intn(300)) * time.Millisecond)
	stopped := time.Now()
	if err := two.stop(t); err != nil {
		t.Fatal(err)
	}
	three.waitPhase(t, connector.PhaseStreaming)
	if took := time.Since(stopped); took > ttl/3+2*time.Second {
		t.Fatalf("after a graceful stop the standby waited %v", took)
	}
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	s.Exec(t, db, `INSERT INTO t VALUES (999999, 0)`)
	checkHistory(t, drainUntil(t, b, "t", "check", "999999"), final, inserted)
}
