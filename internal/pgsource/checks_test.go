package pgsource

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

// waitError waits for phase error and returns its code and sentence.
func (r *running) waitError(t *testing.T) connector.Status {
	t.Helper()
	var st connector.Status
	if err := waitFor(func() error {
		st = r.status.Get()
		if st.Phase != connector.PhaseError {
			return errString("phase " + st.Phase)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

type errString string

func (e errString) Error() string { return string(e) }

func count(t *testing.T, s *pgtest.Server, db, sql string, args ...any) int {
	t.Helper()
	c := s.Connect(t, db)
	var n int
	if err := c.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestChecksRefuseBeforeTouching: every check of the documents and the
// tables gives its code and a sentence naming the fix, before the source
// creates a publication or a slot.
func TestChecksRefuseBeforeTouching(t *testing.T) {
	cases := []struct {
		name   string
		setup  string
		table  string
		part   string
		manage bool
		pub    string
		code   string
		phrase string
	}{
		{name: "table missing", table: "public.nope", manage: true, code: "table_missing", phrase: "does not exist"},
		{name: "no key", setup: "CREATE TABLE nokey (a int, b text)", table: "public.nokey", manage: true, code: "replica_identity", phrase: "no primary key"},
		{name: "identity nothing", setup: "CREATE TABLE nothing (a int PRIMARY KEY); ALTER TABLE nothing REPLICA IDENTITY NOTHING", table: "public.nothing", manage: true, code: "replica_identity", phrase: "REPLICA IDENTITY NOTHING"},
		{name: "partitionBy not in key", setup: "CREATE TABLE pk (a int PRIMARY KEY, b text)", table: "public.pk", part: `["b"]`, manage: true, code: "partition_by", phrase: "not part of the key"},
		{name: "partitionBy unknown column", setup: "CREATE TABLE pk2 (a int PRIMARY KEY)", table: "public.pk2", part: `["zz"]`, manage: true, code: "partition_by", phrase: "not a column"},
		{name: "publication missing", setup: "CREATE TABLE p1 (a int PRIMARY KEY)", table: "public.p1", pub: "mine", code: "publication", phrase: "does not exist"},
		{name: "publication lacks the table", setup: "CREATE TABLE p2 (a int PRIMARY KEY); CREATE TABLE other (a int PRIMARY KEY); CREATE PUBLICATION mine FOR TABLE other", table: "public.p2", pub: "mine", code: "publication", phrase: "does not publish public.p2"},
		{name: "publication row filter", setup: "CREATE TABLE p3 (a int PRIMARY KEY); CREATE PUBLICATION mine FOR TABLE p3 WHERE (a > 1)", table: "public.p3", pub: "mine", code: "publication", phrase: "row filter"},
		{name: "publication column list", setup: "CREATE TABLE p4 (a int PRIMARY KEY, b int); CREATE PUBLICATION mine FOR TABLE p4 (a)", table: "public.p4", pub: "mine", code: "publication", phrase: "column list"},
	}
	s := pgtest.Shared(t)
	b := openBroker(t, "")
	defer b.Close()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := s.NewDatabase(t)
			if c.setup != "" {
				s.Exec(t, db, c.setup)
			}
			spec := connector.TableSpec{Table: c.table, Queue: "q"}
			if c.part != "" {
				spec.PartitionBy = json.RawMessage(c.part)
			}
			doc := sourceDoc(s, db, "chk", spec)
			if c.pub != "" {
				doc.Source.Publication = c.pub
			}
			*doc.Source.ManagePublication = c.manage
			pubsBefore := count(t, s, db, "SELECT count(*) FROM pg_publication")
			src := startSource(t, b, doc, "n1", nil)
			st := src.waitError(t)
			if st.Code != c.code || !strings.Contains(st.Message, c.phrase) {
				t.Fatalf("status %s: %s; want code %s with %q", st.Code, st.Message, c.code, c.phrase)
			}
			src.stop(t)
			if n := count(t, s, db, "SELECT count(*) FROM pg_publication"); n != pubsBefore {
				t.Fatalf("%d publications after the refusal, %d before", n, pubsBefore)
			}
			if n := count(t, s, db, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"); n != 0 {
				t.Fatalf("%d slots after the refusal", n)
			}
		})
	}
}

// TestWalLevelRefused: a server without logical WAL is refused with
// wal_level.
func TestWalLevelRefused(t *testing.T) {
	s := pgtest.Private(t, pgtest.Options{Settings: map[string]string{"wal_level": "replica"}})
	s.Exec(t, "postgres", "CREATE TABLE w (a int PRIMARY KEY)")
	b := openBroker(t, "")
	defer b.Close()
	src := startSource(t, b, sourceDoc(s, "postgres", "wal", connector.TableSpec{Table: "public.w", Queue: "q"}), "n1", nil)
	st := src.waitError(t)
	if st.Code != "wal_level" || !strings.Contains(st.Message, "wal_level = logical") {
		t.Fatalf("status %s: %s", st.Code, st.Message)
	}
}

// TestVersionRefused: against PostgreSQL 16 the source stops with
// version and a sentence naming the fix, before it creates a publication
// or a slot.
func TestVersionRefused(t *testing.T) {
	s := pgtest.Private(t, pgtest.Options{Major: 16})
	s.Exec(t, "postgres", "CREATE TABLE old (a int PRIMARY KEY)")
	b := openBroker(t, "")
	defer b.Close()
	src := startSource(t, b, sourceDoc(s, "postgres", "old", connector.TableSpec{Table: "public.old", Queue: "q"}), "n1", nil)
	st := src.waitError(t)
	if st.Code != "version" || !strings.Contains(st.Message, "PostgreSQL 16.") || !strings.Contains(st.Message, "PostgreSQL 17 or later") || !strings.Contains(st.Message, "upgrade") {
		t.Fatalf("status %s: %s; want version, naming 16 and the upgrade to 17", st.Code, st.Message)
	}
	src.stop(t)
	if n := count(t, s, "postgres", "SELECT count(*) FROM pg_publication"); n != 0 {
		t.Fatalf("%d publications after the refusal", n)
	}
	if n := count(t, s, "postgres", "SELECT count(*) FROM pg_replication_slots"); n != 0 {
		t.Fatalf("%d slots after the refusal", n)
	}
}

// TestManagedPublicationFollowsTables: a managed publication is created
// for the tables, and an existing one with a filter and an extra table is
// set to exactly the source's tables, whole; the slot is a failover slot.
func TestManagedPublicationFollowsTables(t *testing.T) {
	s := pgtest.Shared(t)
	db := s.NewDatabase(t)
	s.Exec(t, db, "CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE x (id int PRIMARY KEY); CREATE PUBLICATION queen_pubs FOR TABLE a WHERE (id > 5), x")
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "pubs", connector.TableSpec{Table: "public.a", Queue: "a"})
	src := startSource(t, b, doc, "n1", nil)
	src.waitPhase(t, connector.PhaseStreaming)
	if n := count(t, s, db, "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'queen_pubs'"); n != 1 {
		t.Fatalf("publication has %d tables, want 1", n)
	}
	if n := count(t, s, db, "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'queen_pubs' AND tablename = 'a' AND rowfilter IS NULL"); n != 1 {
		t.Fatal("table a is not published whole")
	}
	if n := count(t, s, db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'queen_pubs' AND failover AND plugin = 'pgoutput'"); n != 1 {
		t.Fatal("no failover pgoutput slot queen_pubs")
	}
}

// TestEgressRefused: with private networks not allowed, a loopback host is
// refused with egress before anything is read.
func TestEgressRefused(t *testing.T) {
	s, db := ordersSource(t)
	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "egress", connector.TableSpec{Table: "public.orders", Queue: "q"})
	st := startSourceEnv(t, connector.Env{Broker: b, Tenant: "default", Doc: doc, NodeID: "n1"}, nil).waitError(t)
	if st.Code != "egress" || !strings.Contains(st.Message, "QUEEN_PG_ALLOW_PRIVATE_NETWORKS") {
		t.Fatalf("status %s: %s", st.Code, st.Message)
	}
}
