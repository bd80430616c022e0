package pgsource

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

var errCrash = errors.New("crash injected by the test")

// crashAt is a hook that fails the n-th bundle, before or after the broker
// committed it (as a process killed at that point would).
func crashAt(n int, after bool, fired *atomic.Bool) *hooks {
	var count atomic.Int32
	f := func(int, *pointer) error {
		if int(count.Add(1)) == n {
			fired.Store(true)
			return errCrash
		}
		return nil
	}
	if after {
		return &hooks{afterCommit: f}
	}
	return &hooks{beforeCommit: f}
}

func trials() int {
	if n, err := strconv.Atoi(os.Getenv("QUEEN_TRIALS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// TestCrashesDeliverEveryChangeOnce: a source crashes again and again, at
// random bundles of the snapshot and of the stream (before the broker
// committed the bundle, or after it and before PostgreSQL heard of it),
// while a writer updates, inserts and deletes rows. After the last
// restart the queue holds every change exactly once, in commit order per
// key, and each original row at most one snapshot row, never older than an
// update before it.
func TestCrashesDeliverEveryChangeOnce(t *testing.T) {
	for trial := 0; trial < trials(); trial++ {
		seed := time.Now().UnixNano()
		t.Run(fmt.Sprint("trial", trial), func(t *testing.T) {
			t.Logf("seed %d", seed)
			crashTrial(t, rand.New(rand.NewSource(seed)))
		})
	}
}

func crashTrial(t *testing.T, rng *rand.Rand) {
	s, db := ordersSource(t)
	s.Exec(t, db, `CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT g, 0 FROM generate_series(1, 300) g`)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "crash", connector.TableSpec{Table: "public.t", Queue: "t"})
	doc.Source.SnapshotChunkRows = 100
	doc.Source.MaxBundleMessages = 40
	doc.Source.LingerMs = 5

	// Each run crashes at a random bundle; the last one runs to the end.
	// The committer keeps one or two bundles in flight.
	depth := 1 + rng.Intn(2)
	t.Logf("%d bundles in flight", depth)
	withDepth := func(h *hooks) *hooks {
		if h == nil {
			h = &hooks{}
		}
		h.depth = depth
		return h
	}
	crashes := 4
	var fired atomic.Bool
	src := startSource(t, b, doc, "n1", withDepth(crashAt(1+rng.Intn(8), rng.Intn(2) == 1, &fired)))
	// The writer starts once the slot exists (the pointer is written).
	if err := waitFor(func() error {
		_, ok, err := b.KVGet(context.Background(), "default", connector.PointerKey("crash"))
		if err == nil && !ok {
			err = errors.New("no pointer yet")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	writerDone := make(chan error, 1)
	final := map[int]int{}    // original keys: the last v
	inserted := map[int]int{} // keys the writer inserted: last v, -1 once deleted
	wrng := rand.New(rand.NewSource(rng.Int63()))
	go func() { writerDone <- writeLoad(s.URL(db), wrng, final, inserted) }()

	for i := 0; i < crashes; i++ {
		select {
		case err := <-src.done:
			close(src.done)
			if !errors.Is(err, errCrash) {
				t.Fatalf("run %d ended with %v, want the injected crash", i, err)
			}
			t.Logf("run %d crashed as planned", i)
		case <-time.After(60 * time.Second):
			if !fired.Load() {
				// The bundle it was to crash at never came: fine, move on.
				src.stop(t)
			} else {
				t.Fatal("the source did not stop after its crash")
			}
		}
		fired.Store(false)
		var h *hooks
		if i < crashes-1 {
			h = crashAt(1+rng.Intn(8), rng.Intn(2) == 1, &fired)
		}
		src = startSource(t, b, doc, "n1", withDepth(h))
	}
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	s.Exec(t, db, `INSERT INTO t VALUES (999999, 0)`)
	evs := drainUntil(t, b, "t", "check", "999999")
	checkHistory(t, evs, final, inserted)
}

// writeLoad runs 60 transactions: updates of random original rows (v+1),
// inserts of new rows and deletes of them.
func writeLoad(url string, rng *rand.Rand, final, inserted map[int]int) error {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	next := 1000
	if err := c.QueryRow(ctx, "SELECT greatest(1000, max(id)) FROM t").Scan(&next); err != nil {
		return err
	}
	for i := 0; i < 60; i++ {
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		for j, n := 0, 1+rng.Intn(30); j < n; j++ {
			switch rng.Intn(4) {
			case 0:
				next++
				if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ($1, 0)", next); err != nil {
					return err
				}
				inserted[next] = 0
			case 1:
				for k, v := range inserted {
					if v >= 0 {
						if _, err := tx.Exec(ctx, "DELETE FROM t WHERE id = $1", k); err != nil {
							return err
						}
						inserted[k] = -1
						break
					}
				}
			default:
				k := 1 + rng.Intn(300)
				if _, err := tx.Exec(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", k); err != nil {
					return err
				}
				final[k]++
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		time.Sleep(time.Duration(rng.Intn(20)) * time.Millisecond)
	}
	return nil
}

// drainUntil pops everything until the partition marker has arrived, then
// what else arrives within half a second.
func drainUntil(t *testing.T, b *broker.Broker, queue, group, marker string) []got {
	t.Helper()
	var out []got
	seen := false
	deadline := time.Now().Add(120 * time.Second)
	quiet := 0
	for quiet < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: no marker after 120 s (%d messages)", queue, len(out))
		}
		res, err := b.Pop(context.Background(), broker.PopRequest{Tenant: "default", Queue: queue, Group: group, Batch: 10000, Partitions: 10000,
			AutoAck: true, SubscriptionMode: "all", Wait: true, Timeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range res.Messages {
			g, err := decodeGot(m)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, g)
			if m.Partition == marker {
				seen = true
			}
		}
		if seen && len(res.Messages) == 0 {
			quiet++
		}
	}
	return sortGot(out)
}

// checkHistory checks each key's events against what the writer did.
func checkHistory(t *testing.T, evs []got, final, inserted map[int]int) {
	t.Helper()
	ids := map[string]bool{}
	byKey := map[string][]got{}
	for _, g := range evs {
		if ids[g.msg.TxID] {
			t.Fatalf("message id %s twice", g.msg.TxID)
		}
		ids[g.msg.TxID] = true
		byKey[g.msg.Partition] = append(byKey[g.msg.Partition], g)
	}
	vOf := func(g got) int {
		v, err := strconv.Atoi(string(g.ev.After["v"]))
		if err != nil {
			t.Fatalf("no v in %s", g.msg.Data)
		}
		return v
	}
	for k := 1; k <= 300; k++ {
		list := byKey[strconv.Itoa(k)]
		snaps, lastU, lastV := 0, 0, -1
		for _, g := range list {
			switch g.ev.Op {
			case "r":
				snaps++
				if v := vOf(g); v < lastV {
					t.Fatalf("key %d: snapshot row v=%d after an event with v=%d (older after newer)", k, v, lastV)
				} else {
					lastV = v
				}
			case "u":
				v := vOf(g)
				if v != lastU+1 || v < lastV {
					for _, g := range list {
						t.Logf("  %s %s", g.msg.TxID, g.msg.Data)
					}
					t.Fatalf("key %d: update to v=%d after updates up to %d and an event with v=%d (lost, repeated or reordered)", k, v, lastU, lastV)
				}
				lastU, lastV = v, v
			default:
				t.Fatalf("key %d: unexpected %s", k, g.msg.Data)
			}
		}
		if snaps > 1 {
			t.Fatalf("key %d: %d snapshot rows", k, snaps)
		}
		if lastU != final[k] {
			t.Fatalf("key %d: updates reach v=%d, the writer made %d", k, lastU, final[k])
		}
		if final[k] == 0 && snaps != 1 {
			t.Fatalf("key %d: never updated, but %d snapshot rows", k, snaps)
		}
	}
	for k, v := range inserted {
		// A row inserted before its chunk was read may also come as one
		// r, after its c and before its d.
		var list []got
		snaps := 0
		for _, g := range byKey[strconv.Itoa(k)] {
			if g.ev.Op == "r" {
				if snaps++; snaps > 1 || len(list) != 1 {
					t.Fatalf("key %d: a snapshot row out of place (%d events before it)", k, len(list))
				}
				continue
			}
			list = append(list, g)
		}
		want := []string{"c"}
		if v < 0 {
			want = append(want, "d")
		}
		if len(list) != len(want) {
			t.Fatalf("key %d: %d events, want %v", k, len(list), want)
		}
		for i, g := range list {
			if g.ev.Op != want[i] {
				t.Fatalf("key %d: event %d is %s, want %s", k, i, g.ev.Op, want[i])
			}
		}
	}
}
