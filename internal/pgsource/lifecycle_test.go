package pgsource

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

// TestSlotErrors: a slot dropped by hand gives slot_lost; a slot consumed
// beyond the pointer gives slot_ahead; a different cluster behind the same
// address gives system_changed; a resync after slot_lost copies every row
// again under a new epoch.
func TestSlotErrors(t *testing.T) {
	s, db := ordersSource(t)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "slots", connector.TableSpec{Table: "public.orders", Queue: "slots"})
	src := startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	first := drain(t, b, "slots", "g1", 2)
	src.stop(t)

	t.Run("slot_ahead", func(t *testing.T) {
		// The test server commits asynchronously; an advance stops at the
		// flushed WAL, so this commit waits for its flush.
		s.Exec(t, db, "SET synchronous_commit = on; UPDATE orders SET status = 'moved' WHERE id = 1")
		s.Exec(t, db, "SELECT pg_replication_slot_advance('queen_slots', pg_current_wal_lsn())")
		src := startSource(t, b, doc, "n1", nil)
		st := src.waitError(t)
		if st.Code != "slot_ahead" || !strings.Contains(st.Message, "resync") {
			t.Fatalf("status %s: %s", st.Code, st.Message)
		}
	})
	t.Run("slot_lost", func(t *testing.T) {
		s.Exec(t, db, "SELECT pg_drop_replication_slot('queen_slots')")
		src := startSource(t, b, doc, "n1", nil)
		st := src.waitError(t)
		if st.Code != "slot_lost" || !strings.Contains(st.Message, "resync") {
			t.Fatalf("status %s: %s", st.Code, st.Message)
		}
	})
	t.Run("system_changed", func(t *testing.T) {
		other := pgtest.Private(t, pgtest.Options{})
		other.Exec(t, "postgres", ordersDDL)
		moved := doc
		moved.Connection.URL = other.URL("postgres")
		src := startSource(t, b, moved, "n1", nil)
		st := src.waitError(t)
		if st.Code != "system_changed" || !strings.Contains(st.Message, "different PostgreSQL cluster") {
			t.Fatalf("status %s: %s", st.Code, st.Message)
		}
	})
	t.Run("resync", func(t *testing.T) {
		again := doc
		again.Resync = 1
		src := startSource(t, b, again, "n1", nil)
		src.waitPhase(t, connector.PhaseStreaming)
		evs := drain(t, b, "slots", "g1", 2)
		for i, g := range evs {
			if g.ev.Op != "r" {
				t.Fatalf("after resync: %s", g.msg.Data)
			}
			oldEpoch := strings.Split(first[i].msg.TxID, ":")[1]
			if newEpoch := strings.Split(g.msg.TxID, ":")[1]; newEpoch == oldEpoch {
				t.Fatalf("resync kept epoch %s", oldEpoch)
			}
		}
		if string(evs[0].ev.After["status"]) != `"moved"` {
			t.Fatalf("resync copied %s", evs[0].msg.Data)
		}
	})
}

// TestSlotInvalidated: a slot that PostgreSQL invalidated under
// max_slot_wal_keep_size stops the source with slot_invalidated.
func TestSlotInvalidated(t *testing.T) {
	s := pgtest.Private(t, pgtest.Options{Settings: map[string]string{"max_slot_wal_keep_size": "1MB"}})
	s.Exec(t, "postgres", ordersDDL)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, "postgres", "inval", connector.TableSpec{Table: "public.orders", Queue: "inval"})
	src := startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	drain(t, b, "inval", "g", 2)
	src.stop(t)
	for i := 0; i < 4; i++ {
		s.Exec(t, "postgres", "CREATE TABLE IF NOT EXISTS filler (v text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000); SELECT pg_switch_wal()")
	}
	s.Exec(t, "postgres", "CHECKPOINT")
	if n := count(t, s, "postgres", "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'queen_inval' AND wal_status = 'lost'"); n != 1 {
		t.Fatal("the slot was not invalidated; the test cannot provoke slot_invalidated")
	}
	src = startSource(t, b, doc, "n1", nil)
	st := src.waitError(t)
	if st.Code != "slot_invalidated" || !strings.Contains(st.Message, "max_slot_wal_keep_size") {
		t.Fatalf("status %s: %s", st.Code, st.Message)
	}
}

// TestWaitingForSlot: while another process reads the slot, the source
// waits in phase waiting_for_slot, and streams once it is free.
func TestWaitingForSlot(t *testing.T) {
	s, db := ordersSource(t)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "held", connector.TableSpec{Table: "public.orders", Queue: "held"})
	src := startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	drain(t, b, "held", "g", 2)
	src.stop(t)

	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(s.URL(db))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	other, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, other, "queen_held", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'queen_held'"}}); err != nil {
		t.Fatal(err)
	}
	src = startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseWaitingForSlot)
	other.Close(ctx)
	src.waitPhase(t, connector.PhaseStreaming)
	s.Exec(t, db, "UPDATE orders SET status = 'x' WHERE id = 2")
	if evs := drain(t, b, "held", "g", 1); evs[0].ev.Op != "u" {
		t.Fatalf("got %s", evs[0].msg.Data)
	}
}

// TestDeleteDropsSlotAndPublication: a deleted source drops its slot, its
// managed publication and its pointer, then removes the document.
func TestDeleteDropsSlotAndPublication(t *testing.T) {
	s, db := ordersSource(t)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "gone", connector.TableSpec{Table: "public.orders", Queue: "gone"})
	src := startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	src.stop(t)
	doc.Deleting = true
	var removed atomic.Bool
	src = startSourceEnv(t, connector.Env{Broker: b, Tenant: "default", Doc: doc, NodeID: "n1", AllowPrivateNetworks: true,
		Remove: func(context.Context) error { removed.Store(true); return nil }}, nil)
	if err := waitFor(func() error {
		if !removed.Load() {
			return errString("not removed yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s, db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'queen_gone'"); n != 0 {
		t.Fatal("the slot is still there")
	}
	if n := count(t, s, db, "SELECT count(*) FROM pg_publication WHERE pubname = 'queen_gone'"); n != 0 {
		t.Fatal("the publication is still there")
	}
	if _, ok, err := b.KVGet(context.Background(), "default", connector.PointerKey("gone")); err != nil || ok {
		t.Fatalf("pointer still there (%v)", err)
	}
}
