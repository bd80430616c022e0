package pgsink

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

const binTypes = `(seq bigserial, t text, vc varchar(20), i2 int2, i4 int4, i8 int8, n numeric, n2 numeric(12,2),
  b bool, j json, jb jsonb, u uuid, dom posint, d date, ts timestamp, tz timestamptz, f4 real, f8 float8)`

const binCols = `t, vc, i2, i4, i8, n, n2, b, j, jb, u, dom, d, ts, tz, f4, f8`

// binMeta puts the message's metadata into columns that have a binary form.
var binMeta = map[string]string{"partition": "m_part", "offset": "m_off", "transactionId": "m_tx", "createdAt": "m_at", "payload": "m_payload"}

const binMetaTypes = `, m_part text, m_off bigint, m_tx text, m_at timestamptz, m_payload jsonb`

// randomBinRow is a message naming every column of binTypes, in that
// order, with values that take the binary form and values that only
// PostgreSQL's text input can read (spaces, signs, exponents).
func randomBinRow(r *rand.Rand) string {
	pick := func(vs ...string) string { return vs[r.IntN(len(vs))] }
	alphabet := []string{`\\`, `\"`, `\t`, `\n`, `\r`, `\u0001`, `\/`, `N`, `.`, `'`, ` `, "é", "✓", `\ud83d\ude00`, `a`, `\\N`, `\\.`}
	str := func(max int) string {
		var sb strings.Builder
		for n := r.IntN(max + 1); n > 0; n-- {
			sb.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return `"` + sb.String() + `"`
	}
	digits := func(n int) string {
		var sb strings.Builder
		for i := 0; i < n; i++ {
			sb.WriteByte(byte('0' + r.IntN(10)))
		}
		return sb.String()
	}
	number := func() string {
		s := digits(1 + r.IntN(22))
		s = strings.TrimLeft(s, "0")
		if s == "" {
			s = "0"
		}
		if r.IntN(2) == 0 {
			s += "." + digits(1+r.IntN(12))
		}
		if r.IntN(3) == 0 && s != "0" {
			s = "-" + s
		}
		return s
	}
	date := func() string {
		return fmt.Sprintf("%04d-%02d-%02d", 1+r.IntN(9999), 1+r.IntN(12), 1+r.IntN(28))
	}
	clock := func() string {
		c := fmt.Sprintf("%s%02d:%02d:%02d", pick("T", " "), r.IntN(24), r.IntN(60), r.IntN(60))
		if n := r.IntN(8); n > 0 && n <= 6 {
			c += "." + digits(n)
		}
		return c
	}
	zone := func() string {
		return pick("Z", "+00:00", "-03:30", "+05", "+14:00", "-12:00", fmt.Sprintf("+%02d:%02d", r.IntN(14), r.IntN(60)))
	}
	// odd: now and then a value only the text input reads.
	odd := func(v string, rare ...string) string {
		if r.IntN(25) == 0 {
			return rare[r.IntN(len(rare))]
		}
		return v
	}
	fields := []string{
		`"t":` + pick(str(8), str(8), "12.50", "true", "null", "-3"),
		`"vc":` + pick(str(4), `"日本語"`, `""`, "null", "7"),
		`"i2":` + pick("0", "-32768", "32767", `"12"`, `"007"`, "null", fmt.Sprint(r.IntN(65536)-32768)),
		`"i4":` + odd(pick("-2147483648", "2147483647", `"-0"`, fmt.Sprint(r.Int32()), "null"), `" 42"`, `"+5"`),
		`"i8":` + odd(pick("9223372036854775807", "-9223372036854775808", fmt.Sprint(r.Int64()), "null"), `"0x1F"`, `"1_000"`),
		`"n":` + odd(pick(number(), number(), number(), `"007.50"`, "0.000", "123456789012345678901234567890.123456789012", "null"), `"NaN"`, `" 1.5"`),
		`"n2":` + pick("12.345", "-0.005", "0.5", "9999999999.99", `"12.3"`, "-1234.5678", "null", fmt.Sprintf("%d.%0*d", r.IntN(2e9)-1e9, r.IntN(4), r.IntN(100))),
		`"b":` + odd(pick("true", "false", "null"), `"yes"`, `"t"`),
		`"j":` + pick(str(6), "12.50", "true", "null", `"a\"b"`),
		`"jb":` + pick(`{"b":1,"a":"x\ty","a":[1,{"c":null}]}`, `[1,"two",3.50]`, str(6), "null", "12.50"),
		`"u":` + odd(pick(`"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`, `"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"`, "null"), `"{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"`, `"a0eebc999c0b4ef8bb6d6bb9bd380a11"`),
		`"dom":` + pick("1", "42", "2147483647", "null", `"3"`),
		`"d":` + odd(pick(`"`+date()+`"`, `"2000-01-01"`, `"1999-12-31"`, `"2024-02-29"`, `"0001-01-01"`, `"9999-12-31"`, "null"), `"20240101"`, `"Jan 5 2024"`, `"2024-01-01 BC"`),
		`"ts":` + odd(pick(`"`+date()+clock()+`"`, `"`+date()+clock()+`"`, "null"), `"`+date()+clock()+`+02:00"`, `"`+date()+` 24:00:00"`, `"`+date()+`T10:00:00.1234567"`),
		`"f4":` + odd(pick(number(), number(), "0.1", "3.4028234663852886e38", "16777217", "0", "null"), `"-0.0"`, `"Infinity"`),
		`"f8":` + odd(pick(number(), number(), "0.1", "1.7976931348623157", "12345678901234567890123.456", "0.000000000000000000001", "null"), `"NaN"`, `" 1"`),
		`"tz":` + odd(pick(`"`+date()+clock()+zone()+`"`, `"`+date()+clock()+zone()+`"`, "null"), `"`+date()+clock()+`"`, `"`+date()+clock()+` Europe/Paris"`, `"epoch"`),
	}
	return "{" + strings.Join(fields, ",") + "}"
}

// TestBinaryCopyMatchesPopulate: append runs over columns that all have a
// binary form go to PostgreSQL as binary COPY data, and the table holds
// exactly what the populate path writes for the same messages; runs with
// a value only the text input reads go as text, with the same rows; and
// refused values end with the same outcomes and errors.
func TestBinaryCopyMatchesPopulate(t *testing.T) {
	t.Run("plain", func(t *testing.T) { binaryCopyMatchesPopulate(t, "append", nil) })
	t.Run("metadata", func(t *testing.T) { binaryCopyMatchesPopulate(t, "append", binMeta) })
	t.Run("upsert", func(t *testing.T) { binaryCopyMatchesPopulate(t, "upsert", nil) })
}

func binaryCopyMatchesPopulate(t *testing.T, mode string, meta map[string]string) {
	db := newDB(t)
	types := binTypes
	if meta != nil {
		types = strings.TrimSuffix(binTypes, ")") + binMetaTypes + ")"
	}
	// An upsert's key k is the message's number: every message a new row.
	k := 0
	keyed := func(m string) string {
		if mode != "upsert" {
			return m
		}
		k++
		return strings.Replace(m, "{", fmt.Sprintf(`{"k":%d,`, k), 1)
	}
	if mode == "upsert" {
		types = strings.Replace(types, "seq bigserial", "seq bigserial, k int PRIMARY KEY", 1)
	}
	exec(t, db, `CREATE DOMAIN posint AS int CHECK (VALUE > 0)`,
		`CREATE TABLE via_copy `+types, `CREATE TABLE via_populate `+types)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	wc := directWorker(t, db, "via_copy", mode, false, meta)
	wp := directWorker(t, db, "via_populate", mode, true, meta)
	ctx := context.Background()
	var binaryBatches, textBatches, next int
	for b := 0; b < 40; b++ {
		var payloads []string
		for i := 0; i < 1+rng.IntN(20); i++ {
			payloads = append(payloads, keyed(randomBinRow(rng)))
		}
		before := wc.s.binarySent.Load()
		for _, w := range []*worker{wc, wp} {
			res, err := w.apply(ctx, messages(payloads, next, false), nil)
			if err != nil || res.applied+res.refused != len(payloads) {
				t.Fatalf("seed %d, batch %d, %s: %v %+v", seed, b, w.s.table, err, outcomes(res))
			}
		}
		next += len(payloads)
		if wc.s.binarySent.Load() > before {
			binaryBatches++
		} else {
			textBatches++
		}
	}
	t.Logf("%d batches sent in binary, %d as text; %d upsert arrays bound in binary", binaryBatches, textBatches, wc.s.typedArrays.Load())
	if mode == "upsert" {
		if wc.s.typedArrays.Load() == 0 {
			t.Fatalf("seed %d: no upsert array bound in binary", seed)
		}
	} else if binaryBatches == 0 || textBatches == 0 {
		t.Fatalf("seed %d: %d batches in binary, %d as text: the generator misses a path", seed, binaryBatches, textBatches)
	}
	compareBinTables(t, db, meta != nil)

	// A run of values that all take the binary form is sent in binary.
	before, arrays := wc.s.binarySent.Load(), wc.s.typedArrays.Load()
	good := `{"t":"x","vc":"y","i2":1,"i4":2,"i8":3,"n":4.5,"n2":6.789,"b":true,"j":"s","jb":{"k":[1]},"u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","dom":5,` +
		`"d":"2026-12-07","ts":"2026-12-07T19:36:08.5","tz":"2026-12-07 19:36:08.123456-05:00",` +
		`"f4":0.1,"f8":2.5}`
	for _, w := range []*worker{wc, wp} {
		if res, err := w.apply(ctx, messages([]string{keyed(good), keyed(good)}, next, false), nil); err != nil || res.applied != 2 {
			t.Fatalf("%s: %v %+v", w.s.table, err, outcomes(res))
		}
		k -= 2 // the same keys for the populate table
	}
	k += 2
	if mode == "upsert" {
		// Every column's array but t's (text, bound in binary before), vc's
		// (varchar) and dom's (a domain).
		if got := wc.s.typedArrays.Load() - arrays; got != 15 {
			t.Fatalf("%d arrays bound in binary, want 15", got)
		}
	} else if got := wc.s.binarySent.Load() - before; got != 2 {
		t.Fatalf("%d rows sent in binary, want 2", got)
	}
	compareBinTables(t, db, meta != nil)

	// Refused values, each in a partition of its own, among good ones.
	row := func(col, v string) string {
		return strings.Replace(good, `"`+col+`":`, `"`+col+`":`+v+`,"zz`+col+`":`, 1)
	}
	refused := []string{
		good, row("vc", `"this string is longer than twenty"`), row("n2", "100000000000"), row("dom", "-1"),
		row("i4", `"lots"`), good, row("i2", "40000"), row("n", "1e999999"), row("u", `"not-a-uuid"`), good,
		row("d", `"2023-02-29"`), row("tz", `"2023-04-31T00:00:00Z"`),
		row("f4", "0.0000000000000000000000000000000000000000000001"), row("f4", "1000000000000000000000000000000000000000"),
	}
	for i := range refused {
		refused[i] = keyed(refused[i])
	}
	outs := applyBoth(t, ctx, wc, wp, messages(refused, 10000, true)) // unnest_test.go
	states := map[string]int{}
	for _, o := range outs[0] {
		states[strings.Fields(o)[1]]++
	}
	if states[fmt.Sprint(stApplied)] != 3 || states[fmt.Sprint(stRefused)] != 11 {
		t.Fatalf("outcomes %q, want 3 applied and 11 refused", outs[0])
	}
	compareBinTables(t, db, meta != nil)
}

func compareBinTables(t *testing.T, db string, meta bool) {
	t.Helper()
	cols := binCols
	if meta {
		cols += ", m_part, m_off, m_tx, m_at, m_payload"
	}
	compareTablesBy(t, db, cols, "seq") // copy_test.go
	if t.Failed() {
		t.FailNow()
	}
}

// TestBinaryFields: each kind's binary field from COPY text, and the
// fields it leaves to PostgreSQL's text input.
func TestBinaryFields(t *testing.T) {
	be16 := func(vs ...int) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.BigEndian.AppendUint16(b, uint16(int16(v)))
		}
		return b
	}
	be64 := func(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }
	cases := []struct {
		k    binKind
		in   string
		want []byte // nil: refused
	}{
		{binText, `a\\b\nc\td\re`, []byte("a\\b\nc\td\re")},
		{binText, `a\x41`, nil},
		{binText, `trailing\`, nil},
		{binJSONB, `{"a":1}`, append([]byte{1}, `{"a":1}`...)},
		{binInt2, "-32768", be16(-32768)},
		{binInt2, "32768", nil},
		{binInt4, "+1", nil},
		{binInt4, " 1", nil},
		{binInt8, "9223372036854775807", []byte{0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{binInt8, "1.0", nil},
		{binInt8, "-9223372036854775808", []byte{0x80, 0, 0, 0, 0, 0, 0, 0}},
		{binInt8, "9223372036854775808", nil},
		{binInt8, "-9223372036854775809", nil},
		{binInt8, "-", nil},
		{binInt2, "-32769", nil},
		{binInt4, "-2147483648", []byte{0x80, 0, 0, 0}},
		{binNumeric, "0", be16(1, 0, 0, 0, 0)},
		{binNumeric, "12345.678", be16(3, 1, 0, 3, 1, 2345, 6780)},
		{binNumeric, "-0.00005", be16(3, 0, 0x4000, 5, 0, 0, 5000)},
		{binNumeric, "007.5", be16(2, 0, 0, 1, 7, 5000)},
		{binNumeric, "1.", nil},
		{binNumeric, ".5", nil},
		{binNumeric, "1e3", nil},
		{binNumeric, "NaN", nil},
		{binNumeric, "--1", nil},
		{binNumeric, "1.-5", nil},
		{binBool, "true", []byte{1}},
		{binBool, "t", nil},
		{binUUID, "A0EEBC99-9c0b-4ef8-bb6d-6bb9bd380a11", []byte{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}},
		{binUUID, "a0eebc999c0b4ef8bb6d6bb9bd380a11", nil},
		{binDate, "2000-01-01", []byte{0, 0, 0, 0}},
		{binDate, "1999-12-31", []byte{0xff, 0xff, 0xff, 0xff}},
		{binDate, "2023-02-29", nil},
		{binDate, "0000-01-01", nil},
		{binTimestamp, "2000-01-01T00:00:01.5", be64(1500000)},
		{binTimestamp, "2000-01-01 00:00:00.000001", be64(1)},
		{binTimestamp, "2000-01-01T00:00:00Z", nil},
		{binTimestampTZ, "2000-01-01T01:00:00+01:00", be64(0)},
		{binTimestampTZ, "2000-01-01T00:00:00-00:30", be64(1800 * 1000000)},
		{binTimestampTZ, "1999-12-31T23:59:59Z", be64(-1000000)},
		{binTimestampTZ, "2000-01-01T00:00:00", nil},
		{binTimestampTZ, "2000-01-01T24:00:00Z", nil},
		{binTimestampTZ, "2000-01-01T00:00:60Z", nil},
		{binTimestampTZ, "2000-01-01T00:00:00.1234567Z", nil},
		{binTimestampTZ, "2000-01-01T00:00:00.Z", nil},
		{binTimestampTZ, "2000-01-01T00:00:00+15:00", nil},
		{binTimestampTZ, "2000-01-01T00:00:00+0100", nil},
		{binFloat8, "0.1", be64(int64(math.Float64bits(0.1)))},
		{binFloat4, "0.1", binary.BigEndian.AppendUint32(nil, math.Float32bits(0.1))},
		{binFloat8, "-2.5", be64(int64(math.Float64bits(-2.5)))},
		{binFloat4, "1000000000000000000000000000000000000000", nil},
		{binFloat4, "0.000000000000000000000000000000000000000000000001", nil},
		{binFloat8, "-0.0", nil},
		{binFloat8, "1e3", nil},
		{binUUID, "g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", nil},
	}
	for _, c := range cases {
		got, ok := appendBinaryField(nil, c.k, []byte(c.in))
		if c.want == nil {
			if ok {
				t.Errorf("kind %d %q: %x, want refused", c.k, c.in, got)
			}
			continue
		}
		want := binary.BigEndian.AppendUint32(nil, uint32(len(c.want)))
		if !ok || !bytes.Equal(got, append(want, c.want...)) {
			t.Errorf("kind %d %q: %x %v, want %x", c.k, c.in, got, ok, append(want, c.want...))
		}
	}
	if got, ok := appendBinaryField(nil, binInt4, []byte(`\N`)); !ok || !bytes.Equal(got, []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("NULL: %x %v", got, ok)
	}
	// The integers against strconv, on random digit strings near the limits.
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(uint64(seed), 1))
	for i := 0; i < 20000; i++ {
		k := []binKind{binInt2, binInt4, binInt8}[r.IntN(3)]
		bitsOf := map[binKind]int{binInt2: 16, binInt4: 32, binInt8: 64}[k]
		in := fmt.Sprint(r.Int64() >> r.IntN(64))
		if r.IntN(2) == 0 {
			in = "-" + strings.TrimPrefix(in, "-")
		}
		got, ok := appendInt(nil, k, []byte(in))
		v, err := strconv.ParseInt(in, 10, bitsOf)
		if ok != (err == nil) {
			t.Fatalf("seed %d: kind %d %q: taken %v, strconv %v", seed, k, in, ok, err)
		}
		if ok {
			want := binary.BigEndian.AppendUint64(nil, uint64(v))[8-bitsOf/8:]
			if !bytes.Equal(got, want) {
				t.Fatalf("seed %d: kind %d %q: %x, want %x", seed, k, in, got, want)
			}
		}
	}
	// A line with fewer or more fields than columns is refused.
	kinds := []binKind{binInt4, binText}
	for _, line := range []string{"1", "1\ta\tb"} {
		if _, ok := appendBinaryRow(nil, kinds, []byte(line)); ok {
			t.Errorf("line %q taken for two columns", line)
		}
	}
	if _, ok := appendBinaryRow(nil, kinds, []byte("1\t")); !ok {
		t.Errorf("line with an empty last field refused")
	}
}
