package pgsource

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/pgtest"
)

// binaryTable has a column of every type a chunk reads in binary, and
// some it reads as text beside them.
const binaryTable = `CREATE TABLE bin (
  id bigint PRIMARY KEY, b bool, i2 smallint, i4 int, i8 bigint,
  n numeric, n5 numeric(40,5), j json, jb jsonb, tz timestamptz, ts timestamp, ts3 timestamp(3),
  by bytea, u uuid, txt text, vc varchar(10), bp char(4),
  arr int[], f8 float8, d date
)`

// binaryEdges are rows of edge values, one column list each (id first).
var binaryEdges = []string{
	`1, true, -32768, -2147483648, -9223372036854775808, 'NaN', 0, 'null', 'null', 'infinity', '-infinity', '2026-10-03 06:14:39.1239',
	 '', '00000000-0000-0000-0000-000000000000', '', '', '', '{}', 'NaN', 'infinity'`,
	`2, false, 32767, 2147483647, 9223372036854775807, 'Infinity', '-0.00001', '{"a": [1,  2]}', '{"b": {"c": null}, "a": 1.50}', '-infinity', 'infinity', '1999-12-31 23:59:59.9995',
	 '\x00ff10', 'ffffffff-ffff-ffff-ffff-ffffffffffff', E'tab\there "q" \\ ☃', 'ten chars!', 'a', '{1,NULL,3}', '-Infinity', '-infinity'`,
	`3, NULL, 0, 0, 9007199254740993, '-Infinity', '123456789012345678901234567890.12345', '"x"', '"x"', '2000-01-01 00:00:00+00', '2000-01-01 00:00:00', '2000-01-01 00:00:00',
	 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL`,
	`4, true, -1, -1, -1, 0, -1, '[]', '[]', '1999-12-31 23:59:59.999999+00', '1970-01-01 00:00:00.000001', '0044-03-15 12:00:00 BC',
	 '\x', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'x', 'x', 'abcd', '{{1,2},{3,4}}', 1.5e300, '2026-10-03'`,
	`5, false, 1, 1, 1, '0.000000000000000000001', '99999.99999', '1', '1e3', '4714-11-24 00:00:00+00 BC', '294276-12-31 23:59:59.999999', '10000-01-01 00:00:00',
	 '\x7f', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', 'é', 'é', 'é', '{-1}', 0, '0001-01-01 BC'`,
	`6, true, 100, 100000, 10000000000, '10000', '10000.00001', '{}', '{}', '0001-01-01 00:00:00+00', '0001-01-01 00:00:00 BC', '2026-02-28 23:59:59.1',
	 '\xdeadbeef', '01234567-89ab-cdef-0123-456789abcdef', 'NULL', 'null', ' ', '{}', 1e-300, '2000-02-29'`,
	`7, false, 9999, 99999999, 1000000000000000000, '1e-20', '0.1', '{"k":"v"}', '{"k":"v"}', '2024-02-29 12:34:56.5+00', '1900-03-01 00:00:00.05', '1600-02-29 00:00:00.25',
	 '\x0001', 'deadbeef-dead-beef-dead-beefdeadbeef', 'a,b', 'a,b', 'a,b', '{0}', -0.0, '1600-02-29'`,
	`8, true, -9999, -99999999, -1000000000000000000, '-123.4500', '-99999.00000', '0', '-0', '0100-03-01 00:00:00+00', '0001-12-31 23:59:59.999999 BC', '0005-02-29 00:00:00 BC',
	 '\x20', '00000000-0000-0000-0000-000000000001', repeat('x', 3000), 'z', 'zz', '{5}', 3.14, '0001-01-01'`,
}

// randomBinaryRow is a row of random values of the table (id given).
func randomBinaryRow(rng *rand.Rand, id int) string {
	num := func() string {
		var b strings.Builder
		if rng.Intn(2) == 0 {
			b.WriteByte('-')
		}
		b.WriteString(fmt.Sprint(rng.Int63n(1 << uint(rng.Intn(62)+1))))
		if rng.Intn(3) > 0 {
			b.WriteByte('.')
			for i, n := 0, rng.Intn(25)+1; i < n; i++ {
				b.WriteByte(byte('0' + rng.Intn(10)))
			}
		}
		if rng.Intn(4) == 0 {
			fmt.Fprintf(&b, "e%d", rng.Intn(80)-40)
		}
		return b.String()
	}
	// Microseconds from about 4700 BC to 294000 AD, often whole seconds.
	ts := func() string {
		us := rng.Int63n(9_200_000_000_000_000_000) - 210_000_000_000_000_000
		if rng.Intn(3) == 0 {
			us -= us % 1000000
		} else if rng.Intn(3) == 0 {
			us -= us % 1000
		}
		return fmt.Sprintf("'2000-01-01 00:00:00+00'::timestamptz + interval '%d microseconds'", us)
	}
	hex := func(n int) string {
		b := make([]byte, n)
		rng.Read(b)
		return fmt.Sprintf("%x", b)
	}
	uuid := hex(16)
	str := func() string {
		var b strings.Builder
		for i, n := 0, rng.Intn(20); i < n; i++ {
			switch rng.Intn(6) {
			case 0:
				b.WriteString("'' ")
			case 1:
				b.WriteString(`\`)
			case 2:
				b.WriteString("ü")
			default:
				b.WriteByte(byte('a' + rng.Intn(26)))
			}
		}
		return "'" + b.String() + "'"
	}
	return fmt.Sprintf(`%d, %v, %d, %d, %d, %s, round(mod((%s)::numeric, 1e30), 5), '{"n": %s}', '{"n": %s}', %s, (%s)::timestamp, (%s)::timestamp(3),
		'\x%s', '%s-%s-%s-%s-%s', %s, left(%s, 10), left(%s, 4), '{%d}', %d.5, '2026-10-03'`,
		id, rng.Intn(2) == 0, rng.Intn(65536)-32768, rng.Int31()-rng.Int31(), rng.Int63()-rng.Int63(), num(), num(), num(), num(), ts(), ts(), ts(),
		hex(rng.Intn(40)), uuid[:8], uuid[8:12], uuid[12:16], uuid[16:20], uuid[20:], str(), str(), str(), rng.Intn(100), rng.Intn(100))
}

// TestBinaryChunkMatchesText: a chunk read with binary columns holds,
// byte for byte, the values the same chunk read all in text holds: edge
// values of every type read in binary (NaN and the infinities, bigints
// beyond 2^53, negative zero scales, timestamps BC and beyond year 9999,
// fractions with trailing zeros, empty and NULL values) and random ones
// (the seed is logged).
func TestBinaryChunkMatchesText(t *testing.T) {
	s := pgtest.Shared(t)
	db := s.NewDatabase(t)
	s.Exec(t, db, binaryTable)
	// A server default far from UTC shows the session sets its own.
	s.Exec(t, db, "ALTER DATABASE "+db+" SET TimeZone = 'Asia/Tokyo'; ALTER DATABASE "+db+" SET DateStyle = 'SQL, DMY'; ALTER DATABASE "+db+" SET bytea_output = 'escape'")
	for _, row := range binaryEdges {
		s.Exec(t, db, "INSERT INTO bin VALUES ("+row+")")
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	var rows []string
	for i := 0; i < 500; i++ {
		rows = append(rows, "("+randomBinaryRow(rng, 100+i)+")")
	}
	s.Exec(t, db, "INSERT INTO bin VALUES "+strings.Join(rows, ",\n"))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	q, ti, rel := queryTable(ctx, t, s, db, "bin")
	formats := chunkFormats(ti)
	for i, col := range ti.cols {
		want := col != "arr" && col != "f8" && col != "d"
		if (formats[i] == 1) != want {
			t.Fatalf("column %s read in format %d", col, formats[i])
		}
	}
	// Chunks of 64: several, each after the key the one before ended at.
	var after []string
	total := 0
	for {
		bin, err := readChunk(ctx, q, ti, rel, after, 64, 0)
		if err != nil {
			t.Fatal(err)
		}
		text := textChunk(t, q, ti, rel, after, 64)
		if bin.rows() != text.rows() {
			t.Fatalf("binary read %d rows, text %d", bin.rows(), text.rows())
		}
		for i := range text.vals {
			if !bytes.Equal(bin.vals[i], text.vals[i]) || (bin.vals[i] == nil) != (text.vals[i] == nil) {
				row, col := i/text.ncol, i%text.ncol
				t.Errorf("row %s, column %s: binary read %q, text %q", text.vals[row*text.ncol], ti.cols[col], bin.vals[i], text.vals[i])
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		total += bin.rows()
		if bin.rows() < 64 {
			break
		}
		after = bin.key(bin.rows() - 1)
	}
	if want := len(binaryEdges) + len(rows); total != want {
		t.Fatalf("%d rows compared, want %d", total, want)
	}
}

// textChunk reads the chunk as readChunk does, every column in text.
func textChunk(t *testing.T, q *pgx.Conn, ti *tableInfo, rel *relation, after []string, limit int) *chunk {
	t.Helper()
	c := newChunk(ti, rel, limit, 0, nil)
	rr := q.PgConn().ExecParams(context.Background(), chunkQuery(ti, after != nil, limit), chunkParams(after), nil, nil, nil)
	if err := c.fill(rr); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAppendBinaryAsText: the printed forms of binary values, and the
// malformed values that are errors rather than wrong text.
func TestAppendBinaryAsText(t *testing.T) {
	num := func(ndigits, weight int16, sign uint16, dscale int16, digits ...uint16) []byte {
		b := []byte{byte(ndigits >> 8), byte(ndigits), byte(weight >> 8), byte(weight), byte(sign >> 8), byte(sign), byte(dscale >> 8), byte(dscale)}
		for _, d := range digits {
			b = append(b, byte(d>>8), byte(d))
		}
		return b
	}
	ts := func(us int64) []byte {
		return []byte{byte(us >> 56), byte(us >> 48), byte(us >> 40), byte(us >> 32), byte(us >> 24), byte(us >> 16), byte(us >> 8), byte(us)}
	}
	cases := []struct {
		name string
		oid  uint32
		in   []byte
		want string
	}{
		{"bool", oidBool, []byte{1}, "t"},
		{"int8 min", oidInt8, ts(-1 << 63), "-9223372036854775808"},
		{"numeric 12345.678", oidNumeric, num(3, 1, numericPos, 3, 1, 2345, 6780), "12345.678"},
		{"numeric -0.0001", oidNumeric, num(1, -1, numericNeg, 4, 1), "-0.0001"},
		{"numeric 0.00", oidNumeric, num(0, 0, numericPos, 2), "0.00"},
		{"numeric 1e8", oidNumeric, num(1, 2, numericPos, 0, 1), "100000000"},
		{"numeric NaN", oidNumeric, num(0, 0, numericNaN, 0), "NaN"},
		{"numeric -Infinity", oidNumeric, num(0, 0, numericNInf, 0), "-Infinity"},
		{"timestamptz epoch", oidTimestamptz, ts(0), "2000-01-01 00:00:00+00"},
		{"timestamp fraction trimmed", oidTimestamp, ts(500000), "2000-01-01 00:00:00.5"},
		{"timestamp before 2000", oidTimestamp, ts(-1), "1999-12-31 23:59:59.999999"},
		{"timestamp 1 BC", oidTimestamp, ts(-63113904000000000), "0001-01-01 00:00:00 BC"},
		{"timestamptz infinity", oidTimestamptz, ts(1<<63 - 1), "infinity"},
		{"uuid", oidUUID, bytes.Repeat([]byte{0xab}, 16), "abababab-abab-abab-abab-abababababab"},
		{"bytea", oidBytea, []byte{0, 0xff}, `\x00ff`},
		{"jsonb", oidJSONB, append([]byte{1}, `{"a": 1}`...), `{"a": 1}`},
	}
	for _, c := range cases {
		got, err := new(binaryPrinter).appendText(nil, c.oid, c.in)
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	bad := []struct {
		name string
		oid  uint32
		in   []byte
	}{
		{"short int4", oidInt4, []byte{0, 1}},
		{"long bool", oidBool, []byte{0, 1}},
		{"jsonb version 2", oidJSONB, []byte{2, '1'}},
		{"empty jsonb", oidJSONB, nil},
		{"numeric digits missing", oidNumeric, num(2, 0, numericPos, 0, 1)},
		{"numeric digit 10000", oidNumeric, num(1, 0, numericPos, 0, 10000)},
		{"numeric bad sign", oidNumeric, num(0, 0, 0x8000, 0)},
		{"short uuid", oidUUID, []byte{1}},
		{"float8 not read in binary", oidFloat8, ts(0)},
	}
	for _, c := range bad {
		if got, err := new(binaryPrinter).appendText(nil, c.oid, c.in); err == nil {
			t.Errorf("%s: %q, want an error", c.name, got)
		}
	}
}

// TestCivilFromDays: the date of every day over eight centuries either
// side of year 0 matches Go's calendar (proleptic Gregorian, as
// PostgreSQL's).
func TestCivilFromDays(t *testing.T) {
	start := time.Date(-800, 1, 1, 0, 0, 0, 0, time.UTC)
	for d := int64(start.Unix() / 86400); d < 365*2900; d += 1 {
		tm := time.Unix(d*86400, 0).UTC()
		y, m, day := civilFromDays(d)
		if y != int64(tm.Year()) || m != int(tm.Month()) || day != tm.Day() {
			t.Fatalf("day %d: %d-%d-%d, want %v", d, y, m, day, tm)
		}
	}
}

// BenchmarkBinaryAsText: what printing back a row of make bench-source's
// table (bigint, text, integer, timestamptz) costs per row, against
// copying its text.
func BenchmarkBinaryAsText(b *testing.B) {
	name := []byte(strings.Repeat("c4ca4238a0b923820dcc509a6f75849b", 5))
	bin := [][]byte{{0, 0, 0, 0, 0, 1, 0xe2, 0x40}, name, {0, 0, 0x03, 0xe7}, {0, 3, 0x0b, 0x6c, 0x2f, 0x4b, 0x3e, 0x2a}}
	oids := []uint32{oidInt8, oidText, oidInt4, oidTimestamptz}
	text := [][]byte{[]byte("123456"), name, []byte("999"), []byte("2026-12-03 12:42:17.481066+00")}
	buf := make([]byte, 0, 4096)
	b.Run("binary", func(b *testing.B) {
		var p binaryPrinter
		for i := 0; i < b.N; i++ {
			buf = buf[:0]
			for c, v := range bin {
				buf, _ = p.appendText(buf, oids[c], v)
			}
		}
	})
	b.Run("text", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			buf = buf[:0]
			for _, v := range text {
				buf = append(buf, v...)
			}
		}
	})
}

// TestChunkReadErrorKept: a chunk's query that fails reports
// PostgreSQL's error, not a result without columns.
func TestChunkReadErrorKept(t *testing.T) {
	s := pgtest.Shared(t)
	db := s.NewDatabase(t)
	s.Exec(t, db, "CREATE TABLE gone (id bigint PRIMARY KEY, v text)")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, ti, rel := queryTable(ctx, t, s, db, "gone")
	s.Exec(t, db, "DROP TABLE gone")
	_, err := readChunk(ctx, q, ti, rel, nil, 10, 0)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("readChunk of a dropped table: %v, want PostgreSQL's error", err)
	}
}
