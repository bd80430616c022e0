package pgsink

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// pushNumbered pushes messages {"n": i} for i in [from, to), spread over
// parts partitions.
func pushNumbered(t testing.TB, b *broker.Broker, queue string, parts, from, to int) {
	t.Helper()
	var items []broker.PushItem
	flush := func() {
		if len(items) == 0 {
			return
		}
		for {
			_, err := b.Push(context.Background(), "default", items)
			if err == nil {
				break
			}
			t.Logf("push retried: %v", err)
			time.Sleep(50 * time.Millisecond)
		}
		items = items[:0]
	}
	for i := from; i < to; i++ {
		items = append(items, broker.PushItem{Queue: queue, Partition: fmt.Sprintf("p%d", i%parts),
			Payload: []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, pad))})
		if len(items) == 1000 {
			flush()
		}
	}
	flush()
}

const pad = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"

// exactlyOnce checks the table holds 0..n-1 each exactly once.
func exactlyOnce(t testing.TB, db string, n int) {
	t.Helper()
	waitCount(t, db, `SELECT count(*) FROM nums`, n)
	got := query(t, db, `SELECT count(*), count(DISTINCT n), min(n), max(n) FROM nums`)
	if want := fmt.Sprintf("%d | %d | 0 | %d", n, n, n-1); got[0] != want {
		t.Fatalf("table: %s (rows, distinct, min, max), want %s", got[0], want)
	}
}

// TestCrashAfterCommitIsSkipped: batches committed to PostgreSQL but never
// acked (a crash between the two) come back after the lease and are
// recognized by the progress rows: the table holds each message once.
func TestCrashAfterCommitIsSkipped(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	var mu sync.Mutex
	var dropped atomic.Int64
	faultAfterCommit = func() bool {
		mu.Lock()
		defer mu.Unlock()
		if rng.IntN(3) == 0 {
			dropped.Add(1)
			return true
		}
		return false
	}
	t.Cleanup(func() { faultAfterCommit = nil })
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	b := openBroker(t)
	const n = 3000
	pushNumbered(t, b, "nums", 4, 0, n)
	spec := sinkSpec("nums", "public.nums", "append")
	spec.LeaseSeconds, spec.Batch, spec.Workers = 5, 200, 2
	r := startSink(t, b, "nums", db, spec)
	exactlyOnce(t, db, n)
	waitFor(t, "redeliveries skipped", 60*time.Second, func() error {
		if r.metrics.skipped.get() == 0 || dropped.Load() == 0 {
			return fmt.Errorf("skipped %v dropped %d", r.metrics.skipped.get(), dropped.Load())
		}
		return nil
	})
	exactlyOnce(t, db, n)
	if r.metrics.dlq.get() != 0 {
		t.Fatalf("dead letters: %v", r.metrics.dlq.get())
	}
	t.Logf("dropped %d acks, skipped %v redelivered messages", dropped.Load(), r.metrics.skipped.get())
}

// TestPostgresRestart: PostgreSQL restarted twice while the sink writes:
// no loss, no duplicate, no dead letter; in upsert mode each new
// connection makes its COPY staging table again.
func TestPostgresRestart(t *testing.T) {
	for _, mode := range []string{"append", "upsert"} {
		t.Run(mode, func(t *testing.T) {
			pg := pgtest.Private(t, pgtest.Options{})
			db := pg.URL(pg.NewDatabase(t))
			key := ""
			if mode == "upsert" {
				key = " PRIMARY KEY"
			}
			exec(t, db, `CREATE TABLE nums (n int`+key+`, pad text)`)
			b := openBroker(t)
			spec := sinkSpec("nums", "public.nums", mode)
			spec.Batch, spec.Workers = 100, 2
			r := startSink(t, b, "nums", db, spec)
			const n = 20000
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; i < n; i += 500 {
					pushNumbered(t, b, "nums", 8, i, i+500)
					time.Sleep(5 * time.Millisecond)
				}
			}()
			for i := 0; i < 2; i++ {
				waitFor(t, "rows arriving", 60*time.Second, func() error {
					if c := count(t, db, `SELECT count(*) FROM nums`); c < (i+1)*n/4 {
						return fmt.Errorf("%d rows", c)
					}
					return nil
				})
				pg.Restart(t)
				t.Logf("restarted PostgreSQL at %d rows", count(t, db, `SELECT count(*) FROM nums`))
			}
			<-done
			exactlyOnce(t, db, n)
			if r.metrics.dlq.get() != 0 || r.metrics.errors.get() == 0 {
				t.Fatalf("dlq %v errors %v: want no dead letter and the restarts counted as errors", r.metrics.dlq.get(), r.metrics.errors.get())
			}
			waitPhase(t, r, "running", "")
			if c := r.sink.copied.Load(); c < n/2 {
				t.Fatalf("COPY wrote %d rows of %d", c, n)
			}
		})
	}
}

// TestTwoNodesOfThree: a three-node cluster, the sink running on two of
// the nodes (a follower among them) with two workers each, the messages
// pushed through the third: each message lands once.
func TestTwoNodesOfThree(t *testing.T) {
	addrs := testkit.FreeAddrs(t, 3)
	var peers []cluster.Peer
	var cfgs []cluster.Config
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("n%d", i+1)
		cfgs = append(cfgs, cluster.Config{DataDir: filepath.Join(t.TempDir(), id), NodeID: id, RaftAddr: addrs[i]})
		peers = append(peers, cluster.Peer{ID: id, Address: addrs[i]})
	}
	var nodes []*broker.Broker
	for i := range cfgs {
		cfgs[i].Peers = peers
		b, err := broker.Open(broker.Config{Cluster: cfgs[i]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		nodes = append(nodes, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, b := range nodes {
		if err := b.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	spec := func() *sinkSpecT {
		s := sinkSpec("nums", "public.nums", "append")
		s.Batch, s.Workers = 100, 2
		return s
	}
	r2 := startSink(t, nodes[1], "nums", db, spec())
	r3 := startSink(t, nodes[2], "nums", db, spec())
	const n = 10000
	pushNumbered(t, nodes[0], "nums", 16, 0, n)
	exactlyOnce(t, db, n)
	a2, a3 := r2.metrics.applied.get(), r3.metrics.applied.get()
	t.Logf("node 2 applied %v, node 3 applied %v, skipped %v+%v", a2, a3, r2.metrics.skipped.get(), r3.metrics.skipped.get())
	if a2+a3 != n || a2 == 0 || a3 == 0 {
		t.Fatalf("applied %v + %v, want %d split over both nodes", a2, a3, n)
	}
}

// TestRetentionGap: messages the queue's retention deleted before the sink
// wrote them put the sink in error with code retention_gap; dead-lettered
// offsets are not a gap.
func TestRetentionGap(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	b := openBroker(t)
	spec := sinkSpec("nums", "public.nums", "append")
	r := startSink(t, b, "nums", db, spec)
	pushNumbered(t, b, "nums", 1, 0, 1)
	exactlyOnce(t, db, 1)
	r.stop()
	if _, err := b.Configure(context.Background(), broker.ConfigureRequest{Tenant: "default", Queue: "nums",
		Options: map[string]json.RawMessage{"retentionMessages": json.RawMessage(`5`)}}); err != nil {
		t.Fatal(err)
	}
	pushNumbered(t, b, "nums", 1, 1, 21)
	r2 := startSink(t, b, "nums", db, spec)
	st := waitPhase(t, r2, "error", "retention_gap")
	if !strings.Contains(st.Message, "offset 1 to 15") {
		t.Fatalf("message %q does not name the lost offsets", st.Message)
	}
	if c := count(t, db, `SELECT count(*) FROM nums`); c != 1 {
		t.Fatalf("%d rows written past the gap", c)
	}
}

// TestLeaseRenewedDuringLongBatch: a batch that takes longer than
// leaseSeconds (a trigger sleeps 7 s, the lease is 5 s) keeps its lease,
// so its ack succeeds and nothing is delivered twice.
func TestLeaseRenewedDuringLongBatch(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`, `CREATE TABLE slept (x int)`,
		`CREATE FUNCTION slow_once() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN IF NOT EXISTS (SELECT 1 FROM slept) THEN INSERT INTO slept VALUES (1); PERFORM pg_sleep(7); END IF; RETURN NULL; END $$`,
		`CREATE TRIGGER slow BEFORE INSERT ON nums FOR EACH STATEMENT EXECUTE FUNCTION slow_once()`)
	b := openBroker(t)
	const n = 100
	pushNumbered(t, b, "nums", 1, 0, n)
	spec := sinkSpec("nums", "public.nums", "append")
	spec.LeaseSeconds = 5
	r := startSink(t, b, "nums", db, spec)
	waitFor(t, "the group consumed every message", 60*time.Second, func() error {
		gs, err := b.Groups(context.Background(), "default", "pg-nums")
		if err != nil || len(gs) != 1 || gs[0].Consumed != n {
			return fmt.Errorf("groups %+v %v", gs, err)
		}
		return nil
	})
	exactlyOnce(t, db, n)
	if s := r.metrics.skipped.get(); s != 0 {
		t.Fatalf("%v messages delivered again: the lease ran out during the batch", s)
	}
}

// TestSerializationAndDeadlockRetried: serialization failures and
// deadlocks (raised by a trigger for the first four statements; a sequence
// counts them, since it survives the rollbacks) are retried with backoff
// and never dead-letter anything, even with maxAttempts 1.
func TestSerializationAndDeadlockRetried(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`, `CREATE SEQUENCE fails`,
		`CREATE FUNCTION flaky() RETURNS trigger LANGUAGE plpgsql AS $$
		 DECLARE k bigint := nextval('fails');
		 BEGIN
		   IF k <= 2 THEN RAISE EXCEPTION 'simulated serialization failure' USING ERRCODE = '40001'; END IF;
		   IF k <= 4 THEN RAISE EXCEPTION 'simulated deadlock' USING ERRCODE = '40P01'; END IF;
		   RETURN NULL;
		 END $$`,
		`CREATE TRIGGER flaky BEFORE INSERT ON nums FOR EACH STATEMENT EXECUTE FUNCTION flaky()`)
	b := openBroker(t)
	const n = 50
	pushNumbered(t, b, "nums", 2, 0, n)
	spec := sinkSpec("nums", "public.nums", "append")
	spec.MaxAttempts = 1
	r := startSink(t, b, "nums", db, spec)
	exactlyOnce(t, db, n)
	if r.metrics.dlq.get() != 0 || r.metrics.errors.get() < 4 {
		t.Fatalf("dlq %v errors %v: want no dead letter and four retried failures", r.metrics.dlq.get(), r.metrics.errors.get())
	}
	if got := count(t, db, `SELECT last_value FROM fails`); got < 5 {
		t.Fatalf("the trigger ran %d times", got)
	}
	waitPhase(t, r, "running", "")
}

// TestCrashAfterCommitSQLMode: in sql mode a statement that is not
// idempotent (adding to a total) still runs once per message when acks are
// lost after COMMIT.
func TestCrashAfterCommitSQLMode(t *testing.T) {
	// The first two committed batches lose their acks.
	var dropped atomic.Int64
	faultAfterCommit = func() bool { return dropped.Add(1) <= 2 }
	t.Cleanup(func() { faultAfterCommit = nil })
	db := newDB(t)
	exec(t, db, `CREATE TABLE total (id int PRIMARY KEY, sum bigint NOT NULL, calls int NOT NULL)`, `INSERT INTO total VALUES (1, 0, 0)`)
	b := openBroker(t)
	const n = 600
	pushNumbered(t, b, "adds", 4, 0, n)
	spec := sinkSpec("adds", "public.total", "sql")
	spec.Statement = "UPDATE total SET sum = sum + $1::bigint, calls = calls + 1 WHERE id = 1"
	spec.Params = []string{"$.n"}
	spec.LeaseSeconds, spec.Batch = 5, 100
	r := startSink(t, b, "adds", db, spec)
	want := fmt.Sprintf("%d | %d", n*(n-1)/2, n)
	waitFor(t, "every message added once", 90*time.Second, func() error {
		gs, err := b.Groups(context.Background(), "default", "pg-adds")
		if err != nil || len(gs) != 1 || gs[0].Consumed != n {
			return fmt.Errorf("groups %+v %v", gs, err)
		}
		return nil
	})
	if got := query(t, db, `SELECT sum, calls FROM total`); got[0] != want {
		t.Fatalf("total %s, want %s", got[0], want)
	}
	if r.metrics.skipped.get() == 0 {
		t.Fatalf("dropped %d acks, skipped %v: the fault did not happen", min(dropped.Load(), 2), r.metrics.skipped.get())
	}
}
