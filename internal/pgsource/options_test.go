package pgsource

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/queen-mq/queen/internal/connector"
)

// TestPartitionByAndCompositeKeys: a composite key names its partition
// with escaped, joined values; a long one is hashed; partitionBy a key
// column groups rows; "single" puts every row in "all".
func TestPartitionByAndCompositeKeys(t *testing.T) {
	s, db := ordersSource(t)
	s.Exec(t, db, `CREATE TABLE comp (a int, b text, v int, PRIMARY KEY (a, b));
CREATE TABLE grp (a int, b text, PRIMARY KEY (a, b));
CREATE TABLE one (id int PRIMARY KEY);
INSERT INTO comp VALUES (1, 'x|y', 0), (2, repeat('z', 200), 0), (3, 'back\slash', 0);
INSERT INTO grp VALUES (7, 'p'), (7, 'q');
INSERT INTO one VALUES (1), (2);`)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "parts",
		connector.TableSpec{Table: "public.comp", Queue: "comp"},
		connector.TableSpec{Table: "public.grp", Queue: "grp", PartitionBy: json.RawMessage(`["a"]`)},
		connector.TableSpec{Table: "public.one", Queue: "one", PartitionBy: json.RawMessage(`"single"`)})
	src := startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	parts := func(queue string, n int) []string {
		var out []string
		for _, g := range drain(t, b, queue, "g", n) {
			out = append(out, g.msg.Partition)
		}
		return out
	}
	comp := parts("comp", 3)
	want := map[string]bool{`1|x\|y`: true, "~" + sha32("2|"+strings.Repeat("z", 200)): true, `3|back\\slash`: true}
	for _, p := range comp {
		if !want[p] {
			t.Fatalf("composite partitions %q, want %v", comp, want)
		}
	}
	if g := parts("grp", 2); g[0] != "7" || g[1] != "7" {
		t.Fatalf("partitionBy a: %q", g)
	}
	if o := parts("one", 2); o[0] != "all" || o[1] != "all" {
		t.Fatalf("single: %q", o)
	}
	// A change that moves a composite key's partition is d then c.
	s.Exec(t, db, "UPDATE comp SET b = 'w' WHERE a = 1")
	evs := drain(t, b, "comp", "g", 2)
	if evs[0].msg.Partition != `1|w` || evs[0].ev.Op != "c" || evs[1].msg.Partition != `1|x\|y` || evs[1].ev.Op != "d" {
		t.Fatalf("key change: %s in %s, %s in %s", evs[0].ev.Op, evs[0].msg.Partition, evs[1].ev.Op, evs[1].msg.Partition)
	}
}

// TestTruncateAndSnapshotNever: snapshot "never" copies nothing; a
// truncate is a t event with onTruncate "emit" (partitionBy "single") and
// nothing by default.
func TestTruncateAndSnapshotNever(t *testing.T) {
	s, db := ordersSource(t)
	s.Exec(t, db, "CREATE TABLE tr (id int PRIMARY KEY); INSERT INTO tr VALUES (1); CREATE TABLE sk (id int PRIMARY KEY); INSERT INTO sk VALUES (1)")
	b := openBroker(t, "")
	defer b.Close()
	emit := sourceDoc(s, db, "emit", connector.TableSpec{Table: "public.tr", Queue: "tr", PartitionBy: json.RawMessage(`"single"`)})
	emit.Source.Snapshot, emit.Source.OnTruncate = "never", "emit"
	skip := sourceDoc(s, db, "skip", connector.TableSpec{Table: "public.sk", Queue: "sk"})
	skip.Source.Snapshot = "never"
	startSource(t, b, emit, "n1", nil).waitPhase(t, connector.PhaseStreaming)
	startSource(t, b, skip, "n1", nil).waitPhase(t, connector.PhaseStreaming)
	s.Exec(t, db, "TRUNCATE tr; TRUNCATE sk; INSERT INTO tr VALUES (2); INSERT INTO sk VALUES (2)")
	tr := drain(t, b, "tr", "g", 2)
	if tr[0].ev.Op != "t" || tr[0].msg.Partition != "all" || string(tr[0].raw["key"]) != "null" || tr[0].ev.Table != "public.tr" || tr[1].ev.Op != "c" {
		t.Fatalf("emit: %s then %s", tr[0].msg.Data, tr[1].msg.Data)
	}
	if sk := drain(t, b, "sk", "g", 1); sk[0].ev.Op != "c" || string(sk[0].ev.Key["id"]) != "2" {
		t.Fatalf("skip: %s", sk[0].msg.Data)
	}
	// onTruncate "emit" on a table that is not "single" is refused.
	bad := sourceDoc(s, db, "bad", connector.TableSpec{Table: "public.sk", Queue: "sk2"})
	bad.Source.OnTruncate = "emit"
	if st := startSource(t, b, bad, "n1", nil).waitError(t); st.Code != "invalid_connector" {
		t.Fatalf("status %s: %s", st.Code, st.Message)
	}
}

// TestHeartbeatMovesIdleSlot: with the tables idle, heartbeats move the
// slot past WAL written by other tables, so it holds nothing back.
func TestHeartbeatMovesIdleSlot(t *testing.T) {
	s, db := ordersSource(t)
	s.Exec(t, db, "CREATE TABLE other (v text)")
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "hb", connector.TableSpec{Table: "public.orders", Queue: "hb"})
	doc.Source.HeartbeatSeconds = 1
	src := startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	drain(t, b, "hb", "g", 2)
	c := s.Connect(t, db)
	ctx := context.Background()
	var after string
	if _, err := c.Exec(ctx, "SET synchronous_commit = on; INSERT INTO other SELECT repeat('x', 100) FROM generate_series(1, 1000)"); err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&after); err != nil {
		t.Fatal(err)
	}
	target, err := pglogrepl.ParseLSN(after)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitFor(func() error {
		var conf string
		if err := c.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'queen_hb'").Scan(&conf); err != nil {
			return err
		}
		l, err := pglogrepl.ParseLSN(conf)
		if err != nil {
			return err
		}
		if l < target {
			return errString("confirmed " + conf + " still before " + after)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st := src.status.Get(); st.SlotLagBytes == nil {
		t.Fatal("no slot lag in the status")
	}
}
