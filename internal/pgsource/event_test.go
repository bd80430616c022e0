package pgsource

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// TestPartitionNames: every partition-naming rule.
func TestPartitionNames(t *testing.T) {
	long := strings.Repeat("a", 129)
	cases := []struct {
		name   string
		key    []string // the key columns' values; "\x00" stands for NULL
		part   []string // partitionBy columns, nil for the key
		single bool
		want   string
	}{
		{"one column as printed", []string{"42"}, nil, false, "42"},
		{"one column keeps bars", []string{"a|b"}, nil, false, "a|b"},
		{"composite joined", []string{"1", "x"}, nil, false, "1|x"},
		{"composite escapes bar and backslash", []string{`a|b`, `c\d`}, nil, false, `a\|b|c\\d`},
		{"composite NULL", []string{"1", "\x00"}, nil, false, `1|\N`},
		{"single column NULL", []string{"\x00"}, nil, false, `\N`},
		{"128 bytes kept", []string{strings.Repeat("b", 128)}, nil, false, strings.Repeat("b", 128)},
		{"129 bytes hashed", []string{long}, nil, false, "~" + sha32(long)},
		{"single", []string{"42"}, nil, true, "all"},
		{"partitionBy a column", []string{"7", "cust-9"}, []string{"b"}, false, "cust-9"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			names := []string{"a", "b", "c"}[:len(c.key)]
			oids := make([]uint32, len(names))
			for i := range oids {
				oids[i] = 25
			}
			rel, err := newRelation(1, "public.t", "q", names, oids, names, c.part, c.single)
			if err != nil {
				t.Fatal(err)
			}
			var tup tuple
			tup.reset(len(c.key))
			for i, v := range c.key {
				if v == "\x00" {
					tup.kind[i] = colNull
				} else {
					tup.kind[i], tup.val[i] = colText, []byte(v)
				}
			}
			var e encoder
			if got := e.partition(rel, &tup); got != c.want {
				t.Fatalf("partition = %q, want %q", got, c.want)
			}
			// A snapshot row goes to the same partition.
			var b batch
			m := meta{lsn: []byte(`"0/1"`), ts: []byte(`"x"`)}
			e.snapshotRow(&b, rel, &tup, &m, "00000001", 1, 0)
			if items, _ := b.pushItems(); items[0].Partition != c.want {
				t.Fatalf("the snapshot row's partition = %q, want %q", items[0].Partition, c.want)
			}
		})
	}
}

func sha32(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:32]
}

// TestMessageIDs: the three id formats and the LSN format.
func TestMessageIDs(t *testing.T) {
	lsn := pglogrepl.LSN(0x1570D68)
	if got := string(changeID(nil, "00c0b669", lsn, 0, false)); got != "pg:00c0b669:0000000001570D68:0" {
		t.Fatalf("change id %s", got)
	}
	if got := string(changeID(nil, "00c0b669", 0xAB00000001570EA0, 12, true)); got != "pg:00c0b669:AB00000001570EA0:12.1" {
		t.Fatalf("key change id %s", got)
	}
	if got := string(snapshotID(nil, "00c0b669", lsn, 3, false)); got != "pg:00c0b669:s:0000000001570D68:3" {
		t.Fatalf("snapshot id %s", got)
	}
	if got := string(snapshotID(nil, "00c0b669", lsn, 3, true)); got != "pg:00c0b669:s:0000000001570D68:f3" {
		t.Fatalf("fill id %s", got)
	}
	for l, want := range map[pglogrepl.LSN]string{0x1526990: "0/1526990", 0: "0/0", 0x1_0000000A: "1/A", 0xFFFFFFFF_FFFFFFFF: "FFFFFFFF/FFFFFFFF"} {
		if got := string(appendLSN(nil, l)); got != want || got != l.String() {
			t.Fatalf("LSN %d = %s, want %s (pglogrepl %s)", l, got, want, l.String())
		}
	}
	ts := time.Date(2026, 10, 3, 6, 15, 3, 583036000, time.FixedZone("x", 3600))
	if got := string(appendTS(nil, ts)); got != `"2026-10-03T05:15:03.583036Z"` {
		t.Fatalf("ts %s", got)
	}
	if got := string(appendTS(nil, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))); got != `"2026-01-02T03:04:05.000000Z"` {
		t.Fatalf("ts %s", got)
	}
}

// pgoutput message builders, as PostgreSQL writes protocol version 1.
type col struct {
	kind byte
	val  string
}

func tx(v string) col { return col{colText, v} }

var (
	null      = col{kind: colNull}
	unchanged = col{kind: colUnchanged}
)

func tupleBytes(cols ...col) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, c.kind)
		if c.kind == colText {
			b = binary.BigEndian.AppendUint32(b, uint32(len(c.val)))
			b = append(b, c.val...)
		}
	}
	return b
}

func insertMsg(rel uint32, cols ...col) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'I'}, rel)
	return append(append(b, 'N'), tupleBytes(cols...)...)
}

func updateMsg(rel uint32, oldKind byte, old []col, cols ...col) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'U'}, rel)
	if oldKind != 0 {
		b = append(append(b, oldKind), tupleBytes(old...)...)
	}
	return append(append(b, 'N'), tupleBytes(cols...)...)
}

func deleteMsg(rel uint32, oldKind byte, old ...col) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'D'}, rel)
	return append(append(b, oldKind), tupleBytes(old...)...)
}

// ordersRel is the "Try it" table: id bigint key, customer jsonb, status
// text, total numeric, created_at timestamptz.
func ordersRel(t *testing.T, part []string, single bool) *relation {
	t.Helper()
	rel, err := newRelation(16385, "public.orders", "orders",
		[]string{"id", "customer", "status", "total", "created_at"},
		[]uint32{oidInt8, oidJSONB, 25, oidNumeric, oidTimestamptz}, []string{"id"}, part, single)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

type encoded struct {
	partition, id, payload string
}

func encodeOne(t *testing.T, rel *relation, msg []byte, fill *tuple, noReadBack bool) ([]encoded, []int) {
	t.Helper()
	var c change
	if err := c.decode(msg); err != nil {
		t.Fatal(err)
	}
	var e encoder
	var b batch
	tr := &txn{epoch: "00c0b669", commit: 0x1570EA0}
	txnMeta(&tr.meta, tr.commit, 754, []byte(`"2026-10-03T06:15:03.591716Z"`))
	rb := e.encodeChange(&b, rel, &c, tr, 1, fill, noReadBack)
	var out []encoded
	items, _ := b.pushItems()
	for _, it := range items {
		if !json.Valid(it.Payload) {
			t.Fatalf("invalid JSON %s", it.Payload)
		}
		if it.Queue != "orders" {
			t.Fatalf("queue %q", it.Queue)
		}
		out = append(out, encoded{it.Partition, it.TxID, string(it.Payload)})
	}
	return out, rb
}

const tail = `"lsn":"0/1570EA0","xid":754,"ts":"2026-10-03T06:15:03.591716Z","seq":1}`

// TestChangeEvents: insert, update, delete, key change, TOAST unchanged,
// REPLICA IDENTITY FULL and the read-back of a moved row, event for event.
func TestChangeEvents(t *testing.T) {
	row3 := []col{tx("3"), tx(`{"name": "Grace", "tier": "gold"}`), tx("new"), tx("99.90"), tx("2026-10-03 06:15:03.591416+00")}
	after3 := `{"id":3,"customer":{"name": "Grace", "tier": "gold"},"status":"new","total":99.90,"created_at":"2026-10-03T06:15:03.591416+00:00"}`
	cases := []struct {
		name string
		msg  []byte
		want []encoded
	}{
		{"insert", insertMsg(16385, row3...), []encoded{{"3", "pg:00c0b669:0000000001570EA0:1",
			`{"op":"c","table":"public.orders","key":{"id":3},"after":` + after3 + `,"before":null,` + tail}}},
		{"delete default identity", deleteMsg(16385, 'K', tx("2"), null, null, null, null), []encoded{{"2", "pg:00c0b669:0000000001570EA0:1",
			`{"op":"d","table":"public.orders","key":{"id":2},"after":null,"before":{"id":2},` + tail}}},
		{"update", updateMsg(16385, 0, nil, row3...), []encoded{{"3", "pg:00c0b669:0000000001570EA0:1",
			`{"op":"u","table":"public.orders","key":{"id":3},"after":` + after3 + `,"before":null,` + tail}}},
		{"update with unchanged TOAST", updateMsg(16385, 0, nil, tx("3"), unchanged, tx("paid"), tx("1"), null), []encoded{{"3", "pg:00c0b669:0000000001570EA0:1",
			`{"op":"u","table":"public.orders","key":{"id":3},"after":{"id":3,"status":"paid","total":1,"created_at":null},"before":null,"unchanged":["customer"],` + tail}}},
		{"key change moves partition: d then c", updateMsg(16385, 'K', []col{tx("2"), null, null, null, null}, row3...), []encoded{
			{"2", "pg:00c0b669:0000000001570EA0:1", `{"op":"d","table":"public.orders","key":{"id":2},"after":null,"before":{"id":2},` + tail},
			{"3", "pg:00c0b669:0000000001570EA0:1.1", `{"op":"c","table":"public.orders","key":{"id":3},"after":` + after3 + `,"before":null,` + tail}}},
		{"FULL update: whole old row, unchanged filled from it", updateMsg(16385, 'O', []col{tx("3"), tx(`{"a": 1}`), tx("new"), tx("1"), null}, tx("3"), unchanged, tx("paid"), tx("1"), null), []encoded{{"3", "pg:00c0b669:0000000001570EA0:1",
			`{"op":"u","table":"public.orders","key":{"id":3},"after":{"id":3,"customer":{"a": 1},"status":"paid","total":1,"created_at":null},"before":{"id":3,"customer":{"a": 1},"status":"new","total":1,"created_at":null},` + tail}}},
		{"FULL delete: whole old row", deleteMsg(16385, 'O', row3...), []encoded{{"3", "pg:00c0b669:0000000001570EA0:1",
			`{"op":"d","table":"public.orders","key":{"id":3},"after":null,"before":` + after3 + `,` + tail}}},
	}
	rel := ordersRel(t, nil, false)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, rb := encodeOne(t, rel, c.msg, nil, false)
			if rb != nil {
				t.Fatalf("asked to read back %v", rb)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %d events %v, want %d", len(got), got, len(c.want))
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("event %d:\n got %+v\nwant %+v", i, got[i], c.want[i])
				}
			}
		})
	}
}

// TestKeyChangeSamePartition: with partitionBy "single" a key change stays
// one u that carries the old key in before.
func TestKeyChangeSamePartition(t *testing.T) {
	rel := ordersRel(t, nil, true)
	got, _ := encodeOne(t, rel, updateMsg(16385, 'K', []col{tx("2"), null, null, null, null}, tx("3"), tx("{}"), tx("x"), tx("1"), null), nil, false)
	want := `{"op":"u","table":"public.orders","key":{"id":3},"after":{"id":3,"customer":{},"status":"x","total":1,"created_at":null},"before":{"id":2},` + tail
	if len(got) != 1 || got[0].payload != want || got[0].partition != "all" {
		t.Fatalf("got %+v\nwant %s in all", got, want)
	}
}

// TestKeyChangeReadBack: a moved row whose new version lacks a TOAST value
// asks for it, and its c carries the value read back.
func TestKeyChangeReadBack(t *testing.T) {
	rel := ordersRel(t, nil, false)
	msg := updateMsg(16385, 'K', []col{tx("2"), null, null, null, null}, tx("3"), unchanged, tx("x"), tx("1"), null)
	got, rb := encodeOne(t, rel, msg, nil, false)
	if len(got) != 0 || len(rb) != 1 || rb[0] != 1 {
		t.Fatalf("got %v, read back %v; want nothing and column 1", got, rb)
	}
	var fill tuple
	fill.reset(5)
	fill.kind[1], fill.val[1] = colText, []byte(`{"big": true}`)
	got, _ = encodeOne(t, rel, msg, &fill, false)
	if len(got) != 2 || !strings.Contains(got[1].payload, `"after":{"id":3,"customer":{"big": true},"status":"x"`) || strings.Contains(got[1].payload, "unchanged") {
		t.Fatalf("c without the read-back value: %+v", got)
	}
	// The row is gone: the c goes out with the column in unchanged.
	got, _ = encodeOne(t, rel, msg, nil, true)
	if len(got) != 2 || !strings.Contains(got[1].payload, `"unchanged":["customer"]`) {
		t.Fatalf("got %+v", got)
	}
}

// TestSnapshotAndFillEvents: r events carry no xid; a fill holds the key
// and the missing columns, every other column in unchanged.
func TestSnapshotAndFillEvents(t *testing.T) {
	rel := ordersRel(t, nil, false)
	var row tuple
	row.reset(5)
	for i, v := range []string{"1", `{"name": "Ada"}`, "new", "42.00", "2026-10-03 06:14:39.365472+00"} {
		row.kind[i], row.val[i] = colText, []byte(v)
	}
	var e encoder
	var b batch
	m := meta{lsn: []byte(`"0/1526990"`), ts: []byte(`"2026-10-03T06:14:43.797508Z"`)}
	e.snapshotRow(&b, rel, &row, &m, "00c0b669", 0x1526990, 0)
	e.fillRow(&b, rel, &row, []int{1}, &m, "00c0b669", 0x1526990, 0)
	items, _ := b.pushItems()
	want := []encoded{
		{"1", "pg:00c0b669:s:0000000001526990:0", `{"op":"r","table":"public.orders","key":{"id":1},"after":{"id":1,"customer":{"name": "Ada"},"status":"new","total":42.00,"created_at":"2026-10-03T06:14:39.365472+00:00"},"before":null,"lsn":"0/1526990","ts":"2026-10-03T06:14:43.797508Z","seq":0}`},
		{"1", "pg:00c0b669:s:0000000001526990:f0", `{"op":"u","table":"public.orders","key":{"id":1},"after":{"id":1,"customer":{"name": "Ada"}},"before":null,"unchanged":["status","total","created_at"],"lsn":"0/1526990","ts":"2026-10-03T06:14:43.797508Z","seq":0}`},
	}
	for i, it := range items {
		got := encoded{it.Partition, it.TxID, string(it.Payload)}
		if got != want[i] {
			t.Fatalf("event %d:\n got %+v\nwant %+v", i, got, want[i])
		}
	}
}

// TestTupleDecodeRefusesTruncated: a cut message is an error, not a panic.
func TestTupleDecodeRefusesTruncated(t *testing.T) {
	msg := insertMsg(1, tx("hello"), null)
	for n := 1; n < len(msg); n++ {
		var c change
		if err := c.decode(msg[:n]); err == nil {
			t.Fatalf("decode of %d of %d bytes succeeded", n, len(msg))
		}
	}
}

// BenchmarkEncodeInsert: one ~200-byte insert of the orders table, decoded
// and encoded into a batch.
func BenchmarkEncodeInsert(b *testing.B) {
	rel, err := newRelation(16385, "public.orders", "orders",
		[]string{"id", "customer", "status", "total", "created_at"},
		[]uint32{oidInt8, oidJSONB, 25, oidNumeric, oidTimestamptz}, []string{"id"}, nil, false)
	if err != nil {
		b.Fatal(err)
	}
	msg := insertMsg(16385, tx("123456"), tx(`{"name": "Grace Hopper", "tier": "gold", "city": "Arlington"}`), tx("new"), tx("99.90"), tx("2026-10-03 06:15:03.591416+00"))
	tr := &txn{epoch: "00c0b669", commit: 0x1570EA0}
	txnMeta(&tr.meta, tr.commit, 754, []byte(`"2026-10-03T06:15:03.591716Z"`))
	var e encoder
	var c change
	bt := batch{arena: make([]byte, 0, 1<<20)}
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for i := 0; i < b.N; i++ {
		if err := c.decode(msg); err != nil {
			b.Fatal(err)
		}
		e.encodeChange(&bt, rel, &c, tr, i, nil, false)
		if bt.len() == 1000 {
			bt.pushItems()
		}
	}
}

// TestSnapshotRowIDs: the id of every snapshot row is snapshotID of its
// epoch, position and seq, also when the chunk, the epoch or both change
// between rows (the encoder keeps the ids' common start).
func TestSnapshotRowIDs(t *testing.T) {
	rel := ordersRel(t, nil, false)
	var row tuple
	row.reset(5)
	for i, v := range []string{"1", `{}`, "new", "1", "2026-10-03 06:14:39+00"} {
		row.kind[i], row.val[i] = colText, []byte(v)
	}
	var e encoder
	var b batch
	m := meta{lsn: []byte(`"0/1"`), ts: []byte(`"2026-10-03T06:14:43.797508Z"`)}
	rows := []struct {
		epoch string
		pos   pglogrepl.LSN
		seq   int
	}{{"00c0b669", 0x1526990, 0}, {"00c0b669", 0x1526990, 1999}, {"00c0b669", 0x2000000, 0}, {"0000000a", 0x2000000, 12}, {"0000000a", 0xFFFFFFFF00000001, 3}}
	for _, r := range rows {
		e.snapshotRow(&b, rel, &row, &m, r.epoch, r.pos, r.seq)
	}
	items, _ := b.pushItems()
	for i, it := range items {
		r := rows[i]
		if want := string(snapshotID(nil, r.epoch, r.pos, r.seq, false)); it.TxID != want {
			t.Fatalf("row %d: id %s, want %s", i, it.TxID, want)
		}
	}
}

// BenchmarkSnapshotRow: one row of make bench-source's table (a bigint
// key, 160 characters of text, an int, a timestamptz) as a chunk holds
// it, encoded into a batch as an r event, 1,000 to a bundle.
func BenchmarkSnapshotRow(b *testing.B) {
	rel, err := newRelation(16385, "public.b", "b", []string{"id", "name", "n", "at"},
		[]uint32{oidInt8, 25, oidInt4, oidTimestamptz}, []string{"id"}, nil, false)
	if err != nil {
		b.Fatal(err)
	}
	const rows = 2000
	var vals [][]byte
	for i := 0; i < rows; i++ {
		name := strings.Repeat(fmt.Sprintf("%032x", i*7919), 5)
		vals = append(vals, []byte(strconv.Itoa(100000+i)), []byte(name), []byte(strconv.Itoa(i%1000)), []byte("2026-12-01 18:42:07.123456+00"))
	}
	ch := &chunk{rel: rel, ncol: 4, vals: vals}
	m := meta{lsn: []byte(`"0/5391C97"`), ts: []byte(`"2026-12-01T18:42:07.200000Z"`)}
	var e encoder
	var row tuple
	// The committer gives a committed bundle's buffers back (here at once).
	bt := batch{arena: make([]byte, 0, 1<<20), spares: make(chan bundleBufs, 1)}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		ch.row(i%rows, &row)
		e.snapshotRow(&bt, rel, &row, &m, "0e17dddf", 0x5391C98, i%rows)
		if bt.len() == 1000 {
			bt.giveBack(bt.pushItems())
		}
	}
}

// TestBatchReusesCommittedBuffers: a bundle's payloads stay as they were
// while later bundles are built; once it is given back (committed), its
// item list is cleared and the next bundle begun after that is built in
// its buffers;
// an arena over maxSpareArena is not kept.
func TestBatchReusesCommittedBuffers(t *testing.T) {
	rel := ordersRel(t, nil, false)
	var row tuple
	row.reset(5)
	m := meta{lsn: []byte(`"0/1"`), ts: []byte(`"x"`)}
	var e encoder
	b := batch{spares: make(chan bundleBufs, 2)}
	fill := func(id, n int) {
		for i := 0; i < n; i++ {
			for c, v := range []string{strconv.Itoa(id + i), `{}`, "new", "1.00", "2026-10-03 06:14:39+00"} {
				row.kind[c], row.val[c] = colText, []byte(v)
			}
			e.snapshotRow(&b, rel, &row, &m, "00000001", 1, i)
		}
	}
	fill(1, 3)
	items1, arena1 := b.pushItems()
	want := make([]string, len(items1))
	for i, it := range items1 {
		want[i] = string(it.Payload)
	}
	fill(100, 3) // a second bundle in flight: new buffers
	items2, arena2 := b.pushItems()
	if &arena2[0] == &arena1[0] {
		t.Fatal("the bundle in flight's arena was reused before it was given back")
	}
	for i, it := range items1 {
		if string(it.Payload) != want[i] {
			t.Fatalf("payload %d changed while in flight: %s, want %s", i, it.Payload, want[i])
		}
	}
	b.giveBack(items1, arena1)
	for i, it := range items1[:cap(items1)] {
		if it.Partition != "" || it.TxID != "" || it.Payload != nil {
			t.Fatalf("item %d still holds %+v once given back", i, it)
		}
	}
	fill(200, 3) // the third bundle, begun before arena1 came back
	b.pushItems()
	fill(300, 3) // the fourth, in arena1
	items4, arena4 := b.pushItems()
	if &arena4[0] != &arena1[0] {
		t.Fatal("the committed bundle's arena was not reused")
	}
	if items4[0].Partition != "300" || items2[0].Partition != "100" {
		t.Fatalf("partitions %q and %q, want 300 and 100", items4[0].Partition, items2[0].Partition)
	}
	b.giveBack(items2, make([]byte, 0, maxSpareArena+1))
	if n := len(b.spares); n != 0 {
		t.Fatalf("%d spares kept, want none (the arena is over maxSpareArena)", n)
	}
}
