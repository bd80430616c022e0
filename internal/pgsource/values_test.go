package pgsource

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/jsonenc"
)

// TestValueConversion: every conversion rule of the change events, from
// PostgreSQL's text output to JSON.
func TestValueConversion(t *testing.T) {
	cases := []struct {
		name string
		oid  uint32
		in   string
		want string
	}{
		{"bool true", oidBool, "t", `true`},
		{"bool false", oidBool, "f", `false`},
		{"int2", oidInt2, "-32768", `-32768`},
		{"int4", oidInt4, "42", `42`},
		{"bigint above 2^53", oidInt8, "9007199254740993", `9007199254740993`},
		{"numeric digits kept", oidNumeric, "42.00", `42.00`},
		{"numeric 30 digits", oidNumeric, "123456789012345678901234567890.123", `123456789012345678901234567890.123`},
		{"numeric negative fraction", oidNumeric, "-0.50", `-0.50`},
		{"numeric NaN", oidNumeric, "NaN", `"NaN"`},
		{"numeric Infinity", oidNumeric, "Infinity", `"Infinity"`},
		{"numeric -Infinity", oidNumeric, "-Infinity", `"-Infinity"`},
		{"float8", oidFloat8, "1.5e+100", `1.5e+100`},
		{"float8 NaN", oidFloat8, "NaN", `"NaN"`},
		{"float4 -Infinity", oidFloat4, "-Infinity", `"-Infinity"`},
		{"json embedded", oidJSON, `{"a": [1, {"b": null}]}`, `{"a": [1, {"b": null}]}`},
		{"jsonb embedded", oidJSONB, `{"name": "Ada", "tier": "gold"}`, `{"name": "Ada", "tier": "gold"}`},
		{"jsonb scalar", oidJSONB, `"x"`, `"x"`},
		{"timestamptz", oidTimestamptz, "2026-10-03 06:14:39.365472+00", `"2026-10-03T06:14:39.365472+00:00"`},
		{"timestamptz short fraction padded", oidTimestamptz, "2026-10-03 06:14:39.5+00", `"2026-10-03T06:14:39.500000+00:00"`},
		{"timestamptz whole second", oidTimestamptz, "2026-10-03 06:14:39+00", `"2026-10-03T06:14:39.000000+00:00"`},
		{"timestamptz infinity", oidTimestamptz, "infinity", `"infinity"`},
		{"timestamptz BC printed", oidTimestamptz, "0044-03-15 12:00:00+00 BC", `"0044-03-15 12:00:00+00 BC"`},
		{"timestamp", oidTimestamp, "2026-10-03 06:14:39.365472", `"2026-10-03T06:14:39.365472"`},
		{"timestamp whole second", oidTimestamp, "2026-10-03 06:14:39", `"2026-10-03T06:14:39.000000"`},
		{"bytea", oidBytea, `\x01ff`, `"\\x01ff"`},
		{"text escaped", 25, "a\"b\\c\nd\te\x01", `"a\"b\\c\nd\te\u0001"`},
		{"text unicode", 25, "héllo ☃", `"héllo ☃"`},
		{"text invalid utf8", 25, "a\xffb", `"a\ufffdb"`},
		{"int4 array", 1007, "{1,2,3}", `[1,2,3]`},
		{"empty array", 1007, "{}", `[]`},
		{"text array quoting and NULL", 1009, `{a,"b c","d\"e",NULL,"NULL"}`, `["a","b c","d\"e",null,"NULL"]`},
		{"2-d int array", 1007, "{{1,2},{3,4}}", `[[1,2],[3,4]]`},
		{"array with bounds", 1007, "[0:1]={7,8}", `[7,8]`},
		{"bool array", 1000, "{t,f}", `[true,false]`},
		{"numeric array NaN", 1231, "{1.50,NaN}", `[1.50,"NaN"]`},
		{"jsonb array", 3807, `{"{\"a\": 1}","[1, 2]"}`, `[{"a": 1},[1, 2]]`},
		{"bytea array", 1001, `{"\\x01","\\x"}`, `["\\x01","\\x"]`},
		{"timestamptz array", 1185, `{"2026-10-03 06:14:39.365472+00"}`, `["2026-10-03T06:14:39.365472+00:00"]`},
		{"uuid array", 2951, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", `["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]`},
		{"malformed array stays printed", 1007, "{1,2", `"{1,2"`},
		{"unknown array type printed", 99999, "{1,2}", `"{1,2}"`},
		{"date printed", 1082, "2026-10-03", `"2026-10-03"`},
		{"interval printed", 1186, "1 day 02:00:00", `"1 day 02:00:00"`},
		{"uuid printed", 2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
		{"inet printed", 869, "10.0.0.1/8", `"10.0.0.1/8"`},
		{"composite printed", 16400, `(1,"a b")`, `"(1,\"a b\")"`},
		{"range printed", 3904, "[1,5)", `"[1,5)"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := string(appendValue(nil, c.oid, []byte(c.in)))
			if got != c.want {
				t.Fatalf("appendValue(%d, %q) = %s, want %s", c.oid, c.in, got, c.want)
			}
			if !json.Valid([]byte(got)) {
				t.Fatalf("%s is not valid JSON", got)
			}
		})
	}
}

func TestIsJSONNumber(t *testing.T) {
	for in, want := range map[string]bool{
		"0": true, "-0": true, "12": true, "1.5": true, "1e5": true, "1.5E-3": true,
		"": false, "-": false, "01": false, "1.": false, ".5": false, "1e": false, "NaN": false, "+1": false, "1 ": false,
	} {
		if got := isJSONNumber([]byte(in)); got != want {
			t.Errorf("isJSONNumber(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestAppendStringMatchesEncodingJSON: every byte string becomes a JSON
// string that decodes back to the input (invalid UTF-8 as U+FFFD).
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "\u2028\u2029", strings.Repeat("x\"", 100), "\x00\x1f\x7f", "tab\there"} {
		out := appendString(nil, []byte(s))
		var back string
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, out, err)
		}
		if back != s {
			t.Fatalf("%q -> %s -> %q", s, out, back)
		}
	}
}

// TestAppendStringFastPath: the copy of plain ASCII writes exactly what
// the byte-by-byte encoder writes, for every byte value at every place of
// strings from 0 to 24 bytes (each word of the eight-byte check and the
// tail), and for random strings (the seed is logged).
func TestAppendStringFastPath(t *testing.T) {
	check := func(s []byte) {
		t.Helper()
		if got, want := appendString(nil, s), jsonenc.AppendString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("appendString(%q) = %s, the encoder writes %s", s, got, want)
		}
	}
	for n := 0; n <= 24; n++ {
		base := bytes.Repeat([]byte{'a'}, n)
		check(base)
		for i := 0; i < n; i++ {
			for c := 0; c < 256; c++ {
				s := append([]byte(nil), base...)
				s[i] = byte(c)
				check(s)
			}
		}
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	for k := 0; k < 20000; k++ {
		s := make([]byte, rng.Intn(64))
		for i := range s {
			// Mostly printable ASCII, now and then anything.
			if rng.Intn(16) == 0 {
				s[i] = byte(rng.Intn(256))
			} else {
				s[i] = byte(0x20 + rng.Intn(0x5f))
			}
		}
		check(s)
	}
}

// TestArrayElements: the array types converted element by element, and
// their element types (the list the conversion rules name).
func TestArrayElements(t *testing.T) {
	want := map[uint32]uint32{
		1000: oidBool, 1001: oidBytea, 1002: 18, 1003: 19, 1005: oidInt2, 1007: oidInt4,
		1009: 25, 1014: 1042, 1015: 1043, 1016: oidInt8, 1021: oidFloat4, 1022: oidFloat8,
		1028: 26, 1040: 829, 1041: 869, 651: 650, 1115: oidTimestamp, 1182: 1082,
		1183: 1083, 1185: oidTimestamptz, 1187: 1186, 1231: oidNumeric, 1270: 1266,
		199: oidJSON, 2951: 2950, 3807: oidJSONB, 1561: 1560, 1563: 1562,
	}
	for oid := uint32(0); oid < 20000; oid++ {
		elem, ok := arrayElem(oid)
		if w, isArray := want[oid]; ok != isArray || elem != w {
			t.Fatalf("arrayElem(%d) = %d, %v; want %d, %v", oid, elem, ok, w, isArray)
		}
	}
}
