package pgsink

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"time"
)

// An append run whose every column has a type below is sent to
// PostgreSQL in COPY's binary format instead of its text format: the
// backend then skips its line and field parsing and the types' text
// input, about a quarter of its CPU per row (docs/design/connectors.md,
// "The sink's COPY in binary"). The run's text lines stay what decides a
// row's values: each field is converted only when its binary form is
// certain to give exactly what the type's text input gives (the binary
// receive functions apply the column's typmod and the domain's checks
// just as input does); any other field sends the whole run as text, as
// before, so PostgreSQL parses it and refuses what it refuses with its
// own words.

// binKind is how a column's COPY text field becomes its binary field.
type binKind uint8

const (
	binNone        binKind = iota
	binText                // text, varchar: the characters
	binJSON                // json: the characters
	binJSONB               // jsonb: version 1, then the characters
	binInt2                // a plain integer, big-endian
	binInt4                //
	binInt8                //
	binNumeric             // a plain decimal number, in base 10,000 digits
	binBool                // true or false
	binUUID                // the canonical 8-4-4-4-12 hex form
	binDate                // YYYY-MM-DD: days since 2000-01-01
	binTimestamp           // a date and time without a zone: microseconds since 2000-01-01
	binTimestampTZ         // a date and time with a zone: microseconds since 2000-01-01 UTC
	binFloat4              // a plain decimal number, rounded to the nearest float32
	binFloat8              // a plain decimal number, rounded to the nearest float64
)

// The base type oids that have a binKind.
const (
	boolOID    = 16
	int8OID    = 20
	int2OID    = 21
	int4OID    = 23
	varcharOID = 1043
	numericOID = 1700
	uuidOID    = 2950
	dateOID    = 1082
	tsOID      = 1114
	tstzOID    = 1184
	float4OID  = 700
	float8OID  = 701
)

// binKindOf is the binKind of a column whose type (a domain's base type
// resolved) has oid base.
func binKindOf(base uint32) binKind {
	switch base {
	case textOID, varcharOID:
		return binText
	case jsonOID:
		return binJSON
	case jsonbOID:
		return binJSONB
	case int2OID:
		return binInt2
	case int4OID:
		return binInt4
	case int8OID:
		return binInt8
	case numericOID:
		return binNumeric
	case boolOID:
		return binBool
	case uuidOID:
		return binUUID
	case dateOID:
		return binDate
	case tsOID:
		return binTimestamp
	case tstzOID:
		return binTimestampTZ
	case float4OID:
		return binFloat4
	case float8OID:
		return binFloat8
	}
	return binNone
}

// elemOID is the type oid of a binKind's values in a binary array: a
// column's own type, not a domain over it, whose array the upsert binds.
// varchar is not one: its array stays text (unnest.go).
func (k binKind) elemOID() uint32 {
	return [...]uint32{binText: textOID, binJSON: jsonOID, binJSONB: jsonbOID, binInt2: int2OID, binInt4: int4OID,
		binInt8: int8OID, binNumeric: numericOID, binBool: boolOID, binUUID: uuidOID, binDate: dateOID,
		binTimestamp: tsOID, binTimestampTZ: tstzOID, binFloat4: float4OID, binFloat8: float8OID}[k]
}

// binaryArray is column j of rows COPY fields (n a row) as a
// one-dimensional array of k's type in binary format (array_send's): the
// number of dimensions, the has-nulls flag, the element type, the length
// and lower bound, then each element as a binary COPY field. It says no
// when a field has no certain binary form (the array then goes as text).
func binaryArray(fields [][]byte, n, j, rows int, k binKind) ([]byte, bool) {
	size := 20
	for i := 0; i < rows; i++ {
		size += 4 + len(fields[i*n+j])
	}
	a := make([]byte, 20, size)
	binary.BigEndian.PutUint32(a[0:], 1)
	binary.BigEndian.PutUint32(a[8:], k.elemOID())
	binary.BigEndian.PutUint32(a[12:], uint32(rows))
	binary.BigEndian.PutUint32(a[16:], 1)
	for i := 0; i < rows; i++ {
		f := fields[i*n+j]
		if len(f) == 2 && f[0] == '\\' && f[1] == 'N' {
			binary.BigEndian.PutUint32(a[4:], 1)
		}
		var ok bool
		if a, ok = appendBinaryField(a, k, f); !ok {
			return nil, false
		}
	}
	return a, true
}

// copyTextOnly is for benchmarks and tests: every run is sent as text.
var copyTextOnly bool

// binaryKinds is the binKind of each of a run's columns, or nil when one
// has none; remembered per column set.
func (w *worker) binaryKinds(o *op) []binKind {
	cp := w.plan.copy
	if copyTextOnly || cp == nil || len(cp.bin) == 0 {
		return nil
	}
	if k, ok := w.binKinds[o.colKey]; ok {
		return k
	}
	kinds := make([]binKind, len(o.cols))
	for i, c := range o.cols {
		if kinds[i] = cp.bin[c]; kinds[i] == binNone {
			kinds = nil
			break
		}
	}
	if w.binKinds == nil {
		w.binKinds = map[string][]binKind{}
	}
	if len(w.binKinds) < maxColumnSets {
		w.binKinds[o.colKey] = kinds
	}
	return kinds
}

// copyBinaryHeader starts binary COPY data: the signature, no flags, no
// header extension.
const copyBinaryHeader = "PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00"

// appendBinaryRun appends the run's rows as binary COPY data (header,
// tuples, trailer) converted from their text lines, or returns false
// when a field has no certain binary form (dst's bytes past its length
// are then scratch).
func appendBinaryRun(dst []byte, kinds []binKind, run []*op) ([]byte, bool) {
	dst = append(dst, copyBinaryHeader...)
	var ok bool
	for _, o := range run {
		if dst, ok = appendBinaryRow(dst, kinds, o.copy); !ok {
			return dst, false
		}
	}
	return binary.BigEndian.AppendUint16(dst, 0xffff), true
}

// appendBinaryRow appends one tuple from a COPY text line (no newline).
func appendBinaryRow(dst []byte, kinds []binKind, line []byte) ([]byte, bool) {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(kinds)))
	for i, k := range kinds {
		end := bytes.IndexByte(line, '\t')
		if end < 0 {
			end = len(line)
		}
		if (end == len(line)) != (i == len(kinds)-1) {
			return dst, false // not as many fields as columns
		}
		f := line[:end]
		if end < len(line) {
			line = line[end+1:]
		}
		var ok bool
		if dst, ok = appendBinaryField(dst, k, f); !ok {
			return dst, false
		}
	}
	return dst, true
}

// appendBinaryField appends the binary field (length and bytes) of the
// COPY text field f for a column of kind k.
func appendBinaryField(dst []byte, k binKind, f []byte) ([]byte, bool) {
	if len(f) == 2 && f[0] == '\\' && f[1] == 'N' {
		return binary.BigEndian.AppendUint32(dst, math.MaxUint32), true // NULL: length -1
	}
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0) // the length, set below
	var ok bool
	switch k {
	case binText, binJSON, binJSONB:
		if k == binJSONB {
			dst = append(dst, 1)
		}
		dst, ok = appendCopyUnescaped(dst, f) // unnest.go
	case binInt2, binInt4, binInt8:
		dst, ok = appendInt(dst, k, f)
	case binNumeric:
		dst, ok = appendNumeric(dst, f)
	case binBool:
		switch string(f) {
		case "true":
			dst, ok = append(dst, 1), true
		case "false":
			dst, ok = append(dst, 0), true
		}
	case binUUID:
		dst, ok = appendUUID(dst, f)
	case binDate, binTimestamp, binTimestampTZ:
		dst, ok = appendDateTime(dst, k, f)
	case binFloat4, binFloat8:
		dst, ok = appendFloat(dst, k, f)
	}
	if !ok || len(dst)-at-4 > math.MaxInt32 {
		return dst, false
	}
	binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	return dst, true
}

// appendInt appends an integer written -?[0-9]+ that fits the kind's
// width; anything else (spaces, a sign +, a fraction, out of range) is
// left to the type's text input and its error.
func appendInt(dst []byte, k binKind, f []byte) ([]byte, bool) {
	neg := len(f) > 0 && f[0] == '-'
	d := f
	if neg {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 19 {
		return dst, false
	}
	var u uint64
	for _, c := range d {
		if c < '0' || c > '9' {
			return dst, false
		}
		u = u*10 + uint64(c-'0')
	}
	limit := uint64(math.MaxInt64)
	switch k {
	case binInt2:
		limit = math.MaxInt16
	case binInt4:
		limit = math.MaxInt32
	}
	if neg {
		limit++ // the negative end is one further
	}
	if u > limit {
		return dst, false // 19 digits cannot wrap a uint64
	}
	v := int64(u)
	if neg {
		v = -v // for -2^63, u is 2^63 and int64(u) is already -2^63
	}
	switch k {
	case binInt2:
		return binary.BigEndian.AppendUint16(dst, uint16(v)), true
	case binInt4:
		return binary.BigEndian.AppendUint32(dst, uint32(v)), true
	}
	return binary.BigEndian.AppendUint64(dst, uint64(v)), true
}

// plainDigits says whether f[from:] is -?[0-9]+.
func plainDigits(f []byte, from int) bool {
	f = f[from:]
	if len(f) > 0 && f[0] == '-' {
		f = f[1:]
	}
	if len(f) == 0 {
		return false
	}
	for _, c := range f {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// nbase is numeric's digit base, and decDigits the decimal digits of one
// of its digits.
const (
	nbase     = 10000
	decDigits = 4
)

// appendNumeric appends a number written -?[0-9]+(\.[0-9]+)?, at most
// maxCopyNumber characters, as numeric's binary form: the digit count,
// the weight (the power of 10,000 of the first digit), the sign, the
// display scale (the decimal digits after the point, as numeric's input
// keeps them) and the digits. PostgreSQL strips the zeros at either end
// and applies the column's precision and scale, as its input does.
func appendNumeric(dst []byte, f []byte) ([]byte, bool) {
	neg, intPart, frac, ok := plainDecimal(f)
	if !ok {
		return dst, false
	}
	// Pad the integer part on the left and the fraction on the right to
	// whole base-10,000 digits.
	lead := (decDigits - len(intPart)%decDigits) % decDigits
	tail := (decDigits - len(frac)%decDigits) % decDigits
	ndigits := (lead + len(intPart) + len(frac) + tail) / decDigits
	weight := (lead+len(intPart))/decDigits - 1
	sign := uint16(0x0000)
	if neg {
		sign = 0x4000
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(ndigits))
	dst = binary.BigEndian.AppendUint16(dst, uint16(int16(weight)))
	dst = binary.BigEndian.AppendUint16(dst, sign)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(frac)))
	d, n := 0, lead
	emit := func(c byte) {
		d = d*10 + int(c-'0')
		if n++; n == decDigits {
			dst = binary.BigEndian.AppendUint16(dst, uint16(d))
			d, n = 0, 0
		}
	}
	for _, c := range intPart {
		emit(c)
	}
	for _, c := range frac {
		emit(c)
	}
	for i := 0; i < tail; i++ {
		emit('0')
	}
	return dst, true
}

// plainDecimal splits a number written -?[0-9]+(\.[0-9]+)?, at most
// maxCopyNumber characters, into its sign, integer digits and fraction
// digits (nil without a point), or says it is not one.
func plainDecimal(f []byte) (neg bool, intPart, frac []byte, ok bool) {
	if len(f) == 0 || len(f) > maxCopyNumber {
		return false, nil, nil, false
	}
	neg = f[0] == '-'
	s := f
	if neg {
		s = s[1:]
	}
	intPart = s
	if i := bytes.IndexByte(s, '.'); i >= 0 {
		intPart, frac = s[:i], s[i+1:]
		if len(frac) == 0 || !plainDigits(frac, 0) || frac[0] == '-' {
			return false, nil, nil, false
		}
	}
	if len(intPart) == 0 || !plainDigits(intPart, 0) || intPart[0] == '-' {
		return false, nil, nil, false
	}
	return neg, intPart, frac, true
}

// appendUUID appends a uuid written 8-4-4-4-12 hex digits, either case.
func appendUUID(dst []byte, f []byte) ([]byte, bool) {
	if len(f) != 36 || f[8] != '-' || f[13] != '-' || f[18] != '-' || f[23] != '-' {
		return dst, false
	}
	var hi byte
	half := false
	for i, c := range f {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			continue
		}
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return dst, false
		}
		if half {
			dst = append(dst, hi<<4|v)
		} else {
			hi = v
		}
		half = !half
	}
	return dst, true
}

// pgEpoch is PostgreSQL's epoch for dates and timestamps, in Unix seconds.
const pgEpoch = 946684800 // 2000-01-01 00:00:00 UTC

// appendDateTime appends a date (YYYY-MM-DD), a timestamp
// (YYYY-MM-DD[T ]HH:MM:SS[.f{1,6}], no zone: a zone would be ignored by
// the input, so it goes as text) or a timestamptz (the same with Z, ±HH or
// ±HH:MM; without a zone the input takes the session's, so it goes as
// text), of a year from 1 to 9999 and a real day and time. Anything else
// (other spellings, BC, infinity, 24:00, leap seconds, more than six
// digits of fraction, which the input rounds) goes as text.
func appendDateTime(dst []byte, k binKind, f []byte) ([]byte, bool) {
	num := func(b []byte) (int, bool) {
		n := 0
		for _, c := range b {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, len(b) > 0
	}
	if len(f) < 10 || f[4] != '-' || f[7] != '-' {
		return dst, false
	}
	y, ok1 := num(f[0:4])
	mo, ok2 := num(f[5:7])
	d, ok3 := num(f[8:10])
	if !ok1 || !ok2 || !ok3 || y < 1 || mo < 1 || mo > 12 || d < 1 || d > 31 {
		return dst, false
	}
	day := time.Date(y, time.Month(mo), d, 0, 0, 0, 0, time.UTC)
	if day.Day() != d {
		return dst, false // February 30th and the like: the input refuses it
	}
	days := (day.Unix() - pgEpoch) / 86400
	if k == binDate {
		if len(f) != 10 {
			return dst, false
		}
		return binary.BigEndian.AppendUint32(dst, uint32(int32(days))), true
	}
	f = f[10:]
	if len(f) < 9 || (f[0] != 'T' && f[0] != ' ') || f[3] != ':' || f[6] != ':' {
		return dst, false
	}
	h, ok1 := num(f[1:3])
	mi, ok2 := num(f[4:6])
	sec, ok3 := num(f[7:9])
	if !ok1 || !ok2 || !ok3 || h > 23 || mi > 59 || sec > 59 {
		return dst, false
	}
	f = f[9:]
	micros := 0
	if len(f) > 0 && f[0] == '.' {
		n := 1
		for n < len(f) && f[n] >= '0' && f[n] <= '9' {
			n++
		}
		digits := f[1:n]
		if len(digits) == 0 || len(digits) > 6 {
			return dst, false
		}
		micros, _ = num(digits)
		for i := len(digits); i < 6; i++ {
			micros *= 10
		}
		f = f[n:]
	}
	offset := 0 // seconds east of UTC
	switch {
	case len(f) == 0:
		if k == binTimestampTZ {
			return dst, false
		}
	case k == binTimestamp:
		return dst, false
	case len(f) == 1 && f[0] == 'Z':
	case (f[0] == '+' || f[0] == '-') && (len(f) == 3 || (len(f) == 6 && f[3] == ':')):
		oh, ok1 := num(f[1:3])
		om, ok2 := 0, true
		if len(f) == 6 {
			om, ok2 = num(f[4:6])
		}
		if !ok1 || !ok2 || oh > 14 || om > 59 {
			return dst, false
		}
		offset = oh*3600 + om*60
		if f[0] == '-' {
			offset = -offset
		}
	default:
		return dst, false
	}
	secs := days*86400 + int64(h*3600+mi*60+sec-offset)
	return binary.BigEndian.AppendUint64(dst, uint64(secs*1000000+int64(micros))), true
}

// appendFloat appends a number written as numeric's plain form takes it
// (appendNumeric) as a float4 or float8: both strtod and strconv round a
// decimal to the nearest value, so the bits are the input's. A nonzero
// number that rounds to zero or to infinity, which the input refuses as
// out of range, goes as text, and so does zero written with a sign.
func appendFloat(dst []byte, k binKind, f []byte) ([]byte, bool) {
	neg, intPart, frac, ok := plainDecimal(f)
	zero := len(bytes.Trim(intPart, "0")) == 0 && len(bytes.Trim(frac, "0")) == 0
	if !ok || neg && zero {
		return dst, false
	}
	size := 64
	if k == binFloat4 {
		size = 32
	}
	v, err := strconv.ParseFloat(string(f), size)
	if err != nil || math.IsInf(v, 0) || (v == 0 && !zero) {
		return dst, false
	}
	if k == binFloat4 {
		return binary.BigEndian.AppendUint32(dst, math.Float32bits(float32(v))), true
	}
	return binary.BigEndian.AppendUint64(dst, math.Float64bits(v)), true
}
