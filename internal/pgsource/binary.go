package pgsource

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
)

// More type OIDs the snapshot reads in binary.
const (
	oidText    = 25
	oidBpchar  = 1042
	oidVarchar = 1043
	oidUUID    = 2950
)

// binaryReadable reports whether a chunk reads columns of type oid in
// binary: the types whose binary form binaryPrinter turns back into
// exactly what the type's output function prints under the sessions'
// settings (docs/design/source.md, "The watermark snapshot"). Every other
// type (floats, arrays, dates, domains, enums...) is read as text.
func binaryReadable(oid uint32) bool {
	switch oid {
	case oidBool, oidInt2, oidInt4, oidInt8, oidText, oidBpchar, oidVarchar,
		oidJSON, oidJSONB, oidBytea, oidUUID, oidTimestamp, oidTimestamptz, oidNumeric:
		return true
	}
	return false
}

// chunkFormats are the result formats of a chunk's columns: binary (1)
// where binaryReadable, else text (0).
func chunkFormats(t *tableInfo) []int16 {
	f := make([]int16, len(t.oids))
	for i, oid := range t.oids {
		if binaryReadable(oid) {
			f[i] = 1
		}
	}
	return f
}

// binaryPrinter turns binary values into their printed text. It
// remembers the last timestamp's date: the timestamps of a chunk's rows
// are often of one day.
type binaryPrinter struct {
	days    int64
	date    []byte // "2026-10-03 " of days
	dateBC  bool
	hasDate bool
}

// appendText appends the text PostgreSQL prints for the value v of type
// oid sent in binary (with TimeZone UTC, DateStyle ISO and bytea_output
// hex, as both connections set them).
func (p *binaryPrinter) appendText(buf []byte, oid uint32, v []byte) ([]byte, error) {
	switch oid {
	case oidText, oidBpchar, oidVarchar, oidJSON:
		// Their send functions send the text their output functions print.
		return append(buf, v...), nil
	case oidJSONB:
		// A version byte, then jsonb's text output.
		if len(v) < 1 || v[0] != 1 {
			return buf, fmt.Errorf("jsonb of binary version %v, want 1", v[:min(len(v), 1)])
		}
		return append(buf, v[1:]...), nil
	case oidBool:
		if len(v) != 1 {
			return buf, fmt.Errorf("bool of %d bytes", len(v))
		}
		if v[0] != 0 {
			return append(buf, 't'), nil
		}
		return append(buf, 'f'), nil
	case oidInt2:
		if len(v) != 2 {
			return buf, fmt.Errorf("smallint of %d bytes", len(v))
		}
		return strconv.AppendInt(buf, int64(int16(binary.BigEndian.Uint16(v))), 10), nil
	case oidInt4:
		if len(v) != 4 {
			return buf, fmt.Errorf("integer of %d bytes", len(v))
		}
		return strconv.AppendInt(buf, int64(int32(binary.BigEndian.Uint32(v))), 10), nil
	case oidInt8:
		if len(v) != 8 {
			return buf, fmt.Errorf("bigint of %d bytes", len(v))
		}
		return strconv.AppendInt(buf, int64(binary.BigEndian.Uint64(v)), 10), nil
	case oidBytea:
		buf = append(buf, '\\', 'x')
		for _, c := range v {
			buf = append(buf, hexDigits[c>>4], hexDigits[c&15])
		}
		return buf, nil
	case oidUUID:
		if len(v) != 16 {
			return buf, fmt.Errorf("uuid of %d bytes", len(v))
		}
		for i, c := range v {
			if i == 4 || i == 6 || i == 8 || i == 10 {
				buf = append(buf, '-')
			}
			buf = append(buf, hexDigits[c>>4], hexDigits[c&15])
		}
		return buf, nil
	case oidTimestamp, oidTimestamptz:
		if len(v) != 8 {
			return buf, fmt.Errorf("timestamp of %d bytes", len(v))
		}
		return p.appendTimestamp(buf, int64(binary.BigEndian.Uint64(v)), oid == oidTimestamptz), nil
	case oidNumeric:
		return appendPGNumeric(buf, v)
	}
	return buf, fmt.Errorf("type %d is not read in binary", oid)
}

const hexDigits = "0123456789abcdef"

// appendTimestamp prints a timestamp (microseconds since 2000-01-01
// 00:00 UTC) as timestamp_out and timestamptz_out do in UTC with
// DateStyle ISO: "2026-10-03 06:14:39.365472+00", the fraction without
// trailing zeros and left out when zero, years of more than four digits
// in full, years before 1 as "... BC", and infinity.
func (p *binaryPrinter) appendTimestamp(buf []byte, us int64, zone bool) []byte {
	switch us {
	case math.MaxInt64:
		return append(buf, "infinity"...)
	case math.MinInt64:
		return append(buf, "-infinity"...)
	}
	const usPerDay = 86400 * 1000000
	days, tod := us/usPerDay, us%usPerDay
	if tod < 0 {
		days, tod = days-1, tod+usPerDay
	}
	if !p.hasDate || p.days != days {
		p.days, p.hasDate = days, true
		p.date, p.dateBC = appendDate(p.date[:0], days)
	}
	buf = append(buf, p.date...)
	sec := int(tod / 1000000)
	h, mi, se := sec/3600, sec/60%60, sec%60
	buf = append(buf, byte('0'+h/10), byte('0'+h%10), ':', byte('0'+mi/10), byte('0'+mi%10), ':', byte('0'+se/10), byte('0'+se%10))
	if frac := int(tod % 1000000); frac != 0 {
		buf = append(buf, '.', byte('0'+frac/100000), byte('0'+frac/10000%10), byte('0'+frac/1000%10),
			byte('0'+frac/100%10), byte('0'+frac/10%10), byte('0'+frac%10))
		for buf[len(buf)-1] == '0' {
			buf = buf[:len(buf)-1]
		}
	}
	if zone {
		buf = append(buf, "+00"...)
	}
	if p.dateBC {
		buf = append(buf, " BC"...)
	}
	return buf
}

// appendDate appends "yyyy-mm-dd " of a day counted from 2000-01-01, and
// whether it is BC (whose year counts back from 1 BC).
func appendDate(buf []byte, days int64) ([]byte, bool) {
	y, m, d := civilFromDays(days + 10957) // 1970-01-01 to 2000-01-01
	bc := y <= 0
	if bc {
		y = 1 - y // astronomical year 0 is 1 BC
	}
	if y < 10000 {
		buf = append(buf, byte('0'+y/1000), byte('0'+y/100%10), byte('0'+y/10%10), byte('0'+y%10))
	} else {
		buf = strconv.AppendInt(buf, y, 10)
	}
	return append(buf, '-', byte('0'+m/10), byte('0'+m%10), '-', byte('0'+d/10), byte('0'+d%10), ' '), bc
}

// civilFromDays is the proleptic Gregorian date of a day counted from
// 1970-01-01 (year 0 is 1 BC), as PostgreSQL's j2date gives it.
func civilFromDays(z int64) (y int64, m, d int) {
	z += 719468
	era := z / 146097
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	y = yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int(doy - (153*mp+2)/5 + 1)
	if mp < 10 {
		m = int(mp + 3)
	} else {
		m = int(mp - 9)
	}
	if m <= 2 {
		y++
	}
	return y, m, d
}

// Signs of a binary numeric.
const (
	numericPos  = 0x0000
	numericNeg  = 0x4000
	numericNaN  = 0xC000
	numericPInf = 0xD000
	numericNInf = 0xF000
)

// appendPGNumeric prints a binary numeric (ndigits, weight, sign, dscale,
// then ndigits base-10000 digits) as numeric_out does: every digit before
// the point without leading zeros, dscale digits after it, NaN and the
// infinities by name.
func appendPGNumeric(buf []byte, v []byte) ([]byte, error) {
	if len(v) < 8 {
		return buf, fmt.Errorf("numeric of %d bytes", len(v))
	}
	ndigits := int(int16(binary.BigEndian.Uint16(v)))
	weight := int(int16(binary.BigEndian.Uint16(v[2:])))
	sign := binary.BigEndian.Uint16(v[4:])
	dscale := int(int16(binary.BigEndian.Uint16(v[6:])))
	switch sign {
	case numericNaN:
		return append(buf, "NaN"...), nil
	case numericPInf:
		return append(buf, "Infinity"...), nil
	case numericNInf:
		return append(buf, "-Infinity"...), nil
	case numericPos, numericNeg:
	default:
		return buf, fmt.Errorf("numeric of sign %#x", sign)
	}
	if ndigits < 0 || dscale < 0 || len(v) != 8+2*ndigits {
		return buf, fmt.Errorf("numeric of %d digits, scale %d in %d bytes", ndigits, dscale, len(v))
	}
	digit := func(i int) int {
		if i < 0 || i >= ndigits {
			return 0
		}
		return int(binary.BigEndian.Uint16(v[8+2*i:]))
	}
	for i := 0; i < ndigits; i++ {
		if digit(i) > 9999 {
			return buf, fmt.Errorf("numeric digit %d out of range", digit(i))
		}
	}
	if sign == numericNeg {
		buf = append(buf, '-')
	}
	d := 0
	if weight < 0 {
		d = weight + 1
		buf = append(buf, '0')
	} else {
		for ; d <= weight; d++ {
			dig := digit(d)
			if d == 0 {
				buf = strconv.AppendInt(buf, int64(dig), 10) // no leading zeros
			} else {
				buf = append(buf, byte('0'+dig/1000), byte('0'+dig/100%10), byte('0'+dig/10%10), byte('0'+dig%10))
			}
		}
	}
	if dscale > 0 {
		buf = append(buf, '.')
		end := len(buf) + dscale
		for i := 0; i < dscale; i, d = i+4, d+1 {
			dig := digit(d)
			buf = append(buf, byte('0'+dig/1000), byte('0'+dig/100%10), byte('0'+dig/10%10), byte('0'+dig%10))
		}
		buf = buf[:end]
	}
	return buf, nil
}
