package pgsource

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testEnv is an Env whose connection reaches database db of s.
func testEnv(s *pgtest.Server, db string) connector.Env {
	return connector.Env{Doc: connector.Document{Connection: connector.Connection{URL: s.URL(db)}}, AllowPrivateNetworks: true}
}

// queryTable opens a query connection to db, closed with the test, and
// loads the table public.<name> (its queue named the same): the
// connection, the table and its relation.
func queryTable(ctx context.Context, t testing.TB, s *pgtest.Server, db, name string) (*pgx.Conn, *tableInfo, *relation) {
	t.Helper()
	q, err := dialQuery(ctx, testEnv(s, db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close(context.Background()) })
	tables, err := loadTables(ctx, q, []connector.TableSpec{{Table: "public." + name, Queue: name}})
	if err != nil {
		t.Fatal(err)
	}
	rel, err := tables[0].relation()
	if err != nil {
		t.Fatal(err)
	}
	return q, tables[0], rel
}

// typesTable holds one column of each conversion rule; want is each
// column's JSON in an event.
const typesTable = `
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TYPE pair AS (a int, b text);
CREATE TABLE types (
  id bigint PRIMARY KEY, b bool, i2 smallint, i4 int, i8 bigint,
  n numeric(40,5), nnan numeric, ninf numeric, nneg numeric, f8 float8, f4nan real,
  j json, jb jsonb, tz timestamptz, tzw timestamptz, ts timestamp,
  arr int[], arr2 int[], tarr text[], jarr jsonb[], narr numeric[],
  by bytea, d date, iv interval, u uuid, ip inet, e mood, comp pair, r int4range,
  txt text, nul text, vc varchar(10), bp char(3)
);`

const typesRow = `INSERT INTO types VALUES (
  1, true, -32768, 2147483647, 9007199254740993,
  '123456789012345678901234567890.12345', 'NaN', 'Infinity', '-0.50', 1.5, 'NaN',
  '{"b":{"c":null},  "a":[1,2]}', '{"b":{"c":null},"a":[1,2]}', '2026-10-03 08:14:39.365472+02', '2026-10-03 06:14:39+00', '2026-10-03 06:14:39.5',
  '{1,2,NULL}', '{{1,2},{3,4}}', ARRAY['a b', 'c"d', NULL, 'e,f', 'back\slash'], ARRAY['{"x": 1}'::jsonb, '[1]'], '{1.50,NaN}',
  '\x00ff', '2026-10-03', '1 day 2 hours', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '10.0.0.1/8', 'happy', ROW(1, 'a b'), int4range(1, 5),
  E'line1\nline "2"\t\\', NULL, 'short', 'ab'
)`

var typesWant = map[string]string{
	"id": `1`, "b": `true`, "i2": `-32768`, "i4": `2147483647`, "i8": `9007199254740993`,
	"n": `123456789012345678901234567890.12345`, "nnan": `"NaN"`, "ninf": `"Infinity"`, "nneg": `-0.50`, "f8": `1.5`, "f4nan": `"NaN"`,
	"j": `{"b":{"c":null},  "a":[1,2]}`, "jb": `{"a": [1, 2], "b": {"c": null}}`,
	"tz": `"2026-10-03T06:14:39.365472+00:00"`, "tzw": `"2026-10-03T06:14:39.000000+00:00"`, "ts": `"2026-10-03T06:14:39.500000"`,
	"arr": `[1,2,null]`, "arr2": `[[1,2],[3,4]]`, "tarr": `["a b","c\"d",null,"e,f","back\\slash"]`, "jarr": `[{"x": 1},[1]]`, "narr": `[1.50,"NaN"]`,
	"by": `"\\x00ff"`, "d": `"2026-10-03"`, "iv": `"1 day 02:00:00"`, "u": `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`, "ip": `"10.0.0.1/8"`,
	"e": `"happy"`, "comp": `"(1,\"a b\")"`, "r": `"[1,5)"`,
	"txt": `"line1\nline \"2\"\t\\"`, "nul": `null`, "vc": `"short"`, "bp": `"ab "`,
}

// TestRealTuplesConvert: one row of every type, read by the snapshot (r)
// and from the stream (c) of a real PostgreSQL 17, converts as the change
// events say, identically on both paths.
func TestRealTuplesConvert(t *testing.T) {
	s := pgtest.Shared(t)
	db := s.NewDatabase(t)
	s.Exec(t, db, typesTable)
	// A server default far from UTC shows both sessions set their own.
	s.Exec(t, db, "ALTER DATABASE "+db+" SET TimeZone = 'Asia/Tokyo'; ALTER DATABASE "+db+" SET DateStyle = 'SQL, DMY'; ALTER DATABASE "+db+" SET bytea_output = 'escape'")
	s.Exec(t, db, "CREATE PUBLICATION p FOR TABLE types")
	s.Exec(t, db, "SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, false, true)")
	s.Exec(t, db, typesRow)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env := testEnv(s, db)
	q, ti, rel := queryTable(ctx, t, s, db, "types")
	ch, err := readChunk(ctx, q, ti, rel, nil, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ch.rows() != 1 {
		t.Fatalf("chunk holds %d rows, want 1", ch.rows())
	}
	// The snapshot reads its chunks in a pipeline with the watermarks: the
	// same values, byte for byte.
	sn := &snapshotter{r: &run{s: &Source{}, q: q}, prefix: "queen:test:wm", run: "r"}
	w := &chunkWork{id: "r:1", table: ti, rel: rel, limit: 10}
	if _, err := sn.readWindow(ctx, w, nil); err != nil {
		t.Fatal(err)
	}
	if w.chunk.rows() != 1 || len(w.chunk.vals) != len(ch.vals) {
		t.Fatalf("the pipelined read holds %d values, readChunk %d", len(w.chunk.vals), len(ch.vals))
	}
	for i := range ch.vals {
		if !bytes.Equal(w.chunk.vals[i], ch.vals[i]) || (w.chunk.vals[i] == nil) != (ch.vals[i] == nil) {
			t.Fatalf("column %s: the pipelined read has %q, readChunk %q", ti.cols[i], w.chunk.vals[i], ch.vals[i])
		}
	}
	var e encoder
	var b batch
	var row tuple
	ch.row(0, &row)
	m := meta{lsn: []byte(`"0/0"`), ts: appendTS(nil, ch.read)}
	e.snapshotRow(&b, rel, &row, &m, "00000001", 0, 0)

	rc, err := dialReplication(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(context.Background())
	st, err := startStream(ctx, rc, "s", "p", 0)
	if err != nil {
		t.Fatal(err)
	}
	var srel *relation
	var tr txn
	for b.len() < 2 {
		data, _, err := st.next(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if data == nil {
			t.Fatal("no change within 10 s")
		}
		switch data[0] {
		case 'R':
			msg, err := pglogrepl.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if srel, err = relationFromStream(msg.(*pglogrepl.RelationMessage), ti); err != nil {
				t.Fatal(err)
			}
		case 'B':
			msg, err := pglogrepl.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			bm := msg.(*pglogrepl.BeginMessage)
			tr = txn{epoch: "00000001", commit: bm.FinalLSN}
			txnMeta(&tr.meta, bm.FinalLSN, bm.Xid, appendTS(nil, bm.CommitTime))
		case 'I':
			var c change
			if err := c.decode(data); err != nil {
				t.Fatal(err)
			}
			if srel == nil {
				t.Fatal("insert before its relation")
			}
			e.encodeChange(&b, srel, &c, &tr, 0, nil, false)
		}
	}
	items, _ := b.pushItems()
	var afters [2]map[string]json.RawMessage
	for i, it := range items {
		var ev struct {
			Op    string                     `json:"op"`
			After map[string]json.RawMessage `json:"after"`
		}
		if err := json.Unmarshal(it.Payload, &ev); err != nil {
			t.Fatalf("event %s: %v", it.Payload, err)
		}
		if it.Partition != "1" {
			t.Fatalf("partition %q, want 1", it.Partition)
		}
		afters[i] = ev.After
	}
	for i, op := range []string{"r", "c"} {
		if len(afters[i]) != len(typesWant) {
			t.Fatalf("%s event has %d columns, want %d: %s", op, len(afters[i]), len(typesWant), items[i].Payload)
		}
		for col, want := range typesWant {
			if got := string(afters[i][col]); got != want {
				t.Errorf("%s event, column %s = %s, want %s", op, col, got, want)
			}
		}
	}
	if len(items[0].Payload) == 0 || string(mustAfter(t, items[0].Payload)) != string(mustAfter(t, items[1].Payload)) {
		t.Fatalf("r and c differ:\n%s\n%s", items[0].Payload, items[1].Payload)
	}
}

// mustAfter returns the raw "after" object of an event.
func mustAfter(t *testing.T, payload []byte) json.RawMessage {
	t.Helper()
	var ev struct {
		After json.RawMessage `json:"after"`
	}
	if err := json.Unmarshal(payload, &ev); err != nil {
		t.Fatal(err)
	}
	return ev.After
}
