package pgsource

import (
	"bytes"
	"encoding/binary"

	"github.com/queen-mq/queen/internal/jsonenc"
)

// Type OIDs of the built-in types the encoder converts specially.
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidJSON        = 114
	oidFloat4      = 700
	oidFloat8      = 701
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidNumeric     = 1700
	oidJSONB       = 3802
)

// arrayElem maps the OID of an array of a built-in type to its element
// type's OID. Arrays of other types (enums, composites, domains) and box[]
// (whose delimiter is ';') stay printed strings. A switch rather than a
// map: it runs for every value of a type without a rule of its own.
func arrayElem(oid uint32) (uint32, bool) {
	switch oid {
	case 1000:
		return oidBool, true
	case 1001:
		return oidBytea, true
	case 1002:
		return 18, true
	case 1003:
		return 19, true
	case 1005:
		return oidInt2, true
	case 1007:
		return oidInt4, true
	case 1009:
		return 25, true
	case 1014:
		return 1042, true
	case 1015:
		return 1043, true
	case 1016:
		return oidInt8, true
	case 1021:
		return oidFloat4, true
	case 1022:
		return oidFloat8, true
	case 1028:
		return 26, true
	case 1040:
		return 829, true
	case 1041:
		return 869, true
	case 651:
		return 650, true
	case 1115:
		return oidTimestamp, true
	case 1182:
		return 1082, true
	case 1183:
		return 1083, true
	case 1185:
		return oidTimestamptz, true
	case 1187:
		return 1186, true
	case 1231:
		return oidNumeric, true
	case 1270:
		return 1266, true
	case 199:
		return oidJSON, true
	case 2951:
		return 2950, true
	case 3807:
		return oidJSONB, true
	case 1561:
		return 1560, true
	case 1563:
		return 1562, true
	}
	return 0, false
}

// appendValue appends the JSON form of one value PostgreSQL printed as text
// (its type's output function, in the session settings both connections
// use). The same function serves the stream and the snapshot, so an r and a
// c event of one row carry identical values.
func appendValue(buf []byte, oid uint32, text []byte) []byte {
	switch oid {
	case oidBool:
		switch string(text) {
		case "t":
			return append(buf, "true"...)
		case "f":
			return append(buf, "false"...)
		}
	case oidInt2, oidInt4, oidInt8:
		if isJSONNumber(text) {
			return append(buf, text...)
		}
	case oidNumeric, oidFloat4, oidFloat8:
		// NaN, Infinity and -Infinity are no JSON numbers: strings then.
		if isJSONNumber(text) {
			return append(buf, text...)
		}
	case oidJSON, oidJSONB:
		return append(buf, text...)
	case oidTimestamptz:
		return appendTimestamp(buf, text, true)
	case oidTimestamp:
		return appendTimestamp(buf, text, false)
	default:
		if elem, ok := arrayElem(oid); ok {
			if out, ok := appendArray(buf, elem, text); ok {
				return out
			}
		}
	}
	return appendString(buf, text)
}

// isJSONNumber reports whether s is a number in JSON's grammar, which is
// what PostgreSQL prints for integers, numerics and floats except NaN and
// the infinities.
func isJSONNumber(s []byte) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	if i >= len(s) {
		return false
	}
	if s[i] == '0' {
		i++
	} else if s[i] >= '1' && s[i] <= '9' {
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	} else {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return false
		}
	}
	return i == len(s)
}

// appendTimestamp turns PostgreSQL's ISO output in UTC
// ("2026-10-03 06:14:39.365472+00", or without the zone) into
// "2026-10-03T06:14:39.365472+00:00" (or "2026-10-03T06:14:39.365472"),
// always with six fractional digits. Values it does not recognize
// (infinity, BC dates, years beyond 9999) stay the printed string.
func appendTimestamp(buf []byte, text []byte, zone bool) []byte {
	// yyyy-mm-dd hh:mm:ss[.ffffff][+00]
	const base = len("2006-01-02 15:04:05")
	if len(text) < base || text[10] != ' ' || text[4] != '-' || text[13] != ':' {
		return appendString(buf, text)
	}
	rest := text[base:]
	var frac []byte
	if len(rest) > 0 && rest[0] == '.' {
		j := 1
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		frac, rest = rest[1:j], rest[j:]
		if len(frac) > 6 {
			return appendString(buf, text)
		}
	}
	if zone {
		if string(rest) != "+00" {
			return appendString(buf, text)
		}
	} else if len(rest) != 0 {
		return appendString(buf, text)
	}
	buf = append(buf, '"')
	buf = append(buf, text[:10]...)
	buf = append(buf, 'T')
	buf = append(buf, text[11:base]...)
	buf = append(buf, '.')
	buf = append(buf, frac...)
	for i := len(frac); i < 6; i++ {
		buf = append(buf, '0')
	}
	if zone {
		buf = append(buf, "+00:00"...)
	}
	return append(buf, '"')
}

// appendArray converts PostgreSQL's array output ("{1,2}", "{{a,NULL},{\"b c\",d}}",
// "[0:1]={1,2}") into a JSON array whose elements are converted by elem.
// It reports false for text it cannot parse; the caller then writes the
// printed string.
func appendArray(buf []byte, elem uint32, text []byte) ([]byte, bool) {
	if len(text) > 0 && text[0] == '[' {
		// Explicit bounds: the dimensions are dropped, the elements kept.
		i := bytes.IndexByte(text, '=')
		if i < 0 {
			return buf, false
		}
		text = text[i+1:]
	}
	start := len(buf)
	p := arrayParser{text: text}
	out, ok := p.parse(buf, elem)
	if !ok || p.pos != len(text) {
		return buf[:start], false
	}
	return out, true
}

type arrayParser struct {
	text    []byte
	pos     int
	scratch []byte
}

func (p *arrayParser) parse(buf []byte, elem uint32) ([]byte, bool) {
	if p.pos >= len(p.text) || p.text[p.pos] != '{' {
		return buf, false
	}
	p.pos++
	buf = append(buf, '[')
	if p.pos < len(p.text) && p.text[p.pos] == '}' {
		p.pos++
		return append(buf, ']'), true
	}
	for first := true; ; first = false {
		if !first {
			buf = append(buf, ',')
		}
		if p.pos >= len(p.text) {
			return buf, false
		}
		var ok bool
		switch p.text[p.pos] {
		case '{':
			buf, ok = p.parse(buf, elem)
			if !ok {
				return buf, false
			}
		case '"':
			p.pos++
			p.scratch = p.scratch[:0]
			for {
				if p.pos >= len(p.text) {
					return buf, false
				}
				c := p.text[p.pos]
				p.pos++
				if c == '\\' {
					if p.pos >= len(p.text) {
						return buf, false
					}
					c = p.text[p.pos]
					p.pos++
				} else if c == '"' {
					break
				}
				p.scratch = append(p.scratch, c)
			}
			buf = appendValue(buf, elem, p.scratch)
		default:
			j := p.pos
			for j < len(p.text) && p.text[j] != ',' && p.text[j] != '}' {
				j++
			}
			v := p.text[p.pos:j]
			p.pos = j
			if string(v) == "NULL" {
				buf = append(buf, "null"...)
			} else {
				buf = appendValue(buf, elem, v)
			}
		}
		if p.pos >= len(p.text) {
			return buf, false
		}
		switch p.text[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return append(buf, ']'), true
		default:
			return buf, false
		}
	}
}

// appendString appends s as a JSON string; bytes that are not UTF-8 (a
// database in SQL_ASCII) become U+FFFD. Most printed values are plain
// ASCII that needs no escaping: those are copied as they are, checked
// eight bytes at a time, and only the others go through the encoder's
// byte-by-byte loop (which writes a plain string the same way).
func appendString(buf []byte, s []byte) []byte {
	if !plainASCII(s) {
		return jsonenc.AppendString(buf, s)
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

// plainASCII reports whether every byte of s is printable ASCII other
// than a quote or a backslash: what a JSON string holds unescaped.
func plainASCII(s []byte) bool {
	const (
		lo = 0x0101010101010101
		hi = 0x8080808080808080
	)
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := binary.LittleEndian.Uint64(s[i:])
		q := x ^ (lo * '"')
		b := x ^ (lo * '\\')
		// Per byte, the high bit is set where x is 0x80 or above, below
		// 0x20, or equal to a quote or a backslash (any one such byte
		// shows; which one does not matter).
		if (x|(x-lo*0x20)&^x|(q-lo)&^q|(b-lo)&^b)&hi != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// appendStringS is appendString for a Go string.
func appendStringS(buf []byte, s string) []byte { return jsonenc.AppendString(buf, s) }
