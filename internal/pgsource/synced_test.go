package pgsource

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestIntervalDurabilityConfirmsOnlySynced: under QUEEN_FSYNC=interval a
// committed bundle may still be lost with the nodes' page caches, so its
// position is confirmed to PostgreSQL only after broker.WaitSynced
// returned. With that wait held, bundles commit and the pointer moves,
// but neither a status update nor the slot's confirmed_flush_lsn passes
// the pointer from before; once the wait runs, the slot reaches the new
// pointer.
func TestIntervalDurabilityConfirmsOnlySynced(t *testing.T) {
	s := pgtest.Shared(t)
	db := s.NewDatabase(t)
	s.Exec(t, db, "CREATE TABLE sy (id int PRIMARY KEY)")
	b, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: t.TempDir(), RaftAddr: testkit.FreeAddr(t), Fsync: cluster.FsyncInterval}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	wctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := b.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	if d := b.Durability(); d != "interval" {
		t.Fatalf("durability %q, want interval", d)
	}
	doc := sourceDoc(s, db, "synced", connector.TableSpec{Table: "public.sy", Queue: "sy"})
	doc.Source.Snapshot = "never"
	doc.Source.HeartbeatSeconds = 3600 // no pointer-only writes in the way

	var hold atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	var sentWhileHeld atomic.Uint64
	var waits atomic.Int32
	h := &hooks{
		waitSynced: func(ctx context.Context, wait func(context.Context) error) error {
			if hold.Load() {
				select {
				case held <- struct{}{}:
				default:
				}
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			waits.Add(1)
			return wait(ctx)
		},
		statusSent: func(l pglogrepl.LSN) {
			if hold.Load() && uint64(l) > sentWhileHeld.Load() {
				sentWhileHeld.Store(uint64(l))
			}
		},
	}
	src := startSource(t, b, doc, "n1", h)
	src.waitPhase(t, connector.PhaseStreaming)
	ctx := context.Background()
	pointerLSN := func() pglogrepl.LSN {
		e, ok, err := b.KVGet(ctx, "default", connector.PointerKey("synced"))
		if err != nil || !ok {
			t.Fatalf("pointer: %v (found %v)", err, ok)
		}
		var p pointer
		if err := json.Unmarshal(e.Value, &p); err != nil {
			t.Fatal(err)
		}
		return pglogrepl.LSN(p.FlushLSN)
	}
	c := s.Connect(t, db)
	confirmed := func() pglogrepl.LSN {
		var v string
		if err := c.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", src.src.slot).Scan(&v); err != nil {
			t.Fatal(err)
		}
		l, err := pglogrepl.ParseLSN(v)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	p0 := pointerLSN()
	hold.Store(true)
	for i := 1; i <= 5; i++ {
		s.Exec(t, db, fmt.Sprintf("INSERT INTO sy VALUES (%d)", i))
	}
	var p1 pglogrepl.LSN
	if err := testkit.CheckFor(30*time.Second, 10*time.Millisecond, func() error {
		if p1 = pointerLSN(); p1 <= p0 {
			return fmt.Errorf("pointer still at %s", p1)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Without the wait a committed position is sent within statusEvery;
	// three of those pass with nothing beyond p0 confirmed.
	end := time.Now().Add(3 * statusEvery)
	for time.Now().Before(end) {
		if l := pglogrepl.LSN(sentWhileHeld.Load()); l > p0 {
			t.Fatalf("a status update confirmed %s while the sync was held (pointer before %s, now %s)", l, p0, pointerLSN())
		}
		if l := confirmed(); l > p0 {
			t.Fatalf("the slot confirmed %s while the sync was held (pointer before %s, now %s)", l, p0, pointerLSN())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-held:
	default:
		t.Fatal("the source did not wait for a sync after its commits")
	}
	hold.Store(false)
	before := waits.Load()
	close(release)
	if err := testkit.CheckFor(30*time.Second, 20*time.Millisecond, func() error {
		if l := confirmed(); l < p1 {
			return fmt.Errorf("the slot confirmed %s, the pointer is at %s", l, p1)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if waits.Load() <= before {
		t.Fatal("the slot moved without a WaitSynced after the release")
	}
	drain(t, b, "sy", "g", 5)
}
