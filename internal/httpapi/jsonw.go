package httpapi

import (
	"strconv"
	"time"

	"github.com/queen-mq/queen/internal/jsonenc"
)

// appendString appends s as a JSON string (jsonenc.AppendString).
func appendString(b []byte, s string) []byte { return jsonenc.AppendString(b, s) }

func appendNullableString(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendString(b, s)
}

func appendUintString(b []byte, v uint64) []byte {
	b = append(b, '"')
	b = strconv.AppendUint(b, v, 10)
	return append(b, '"')
}

// timeLayout is RFC 3339 in UTC with microseconds.
const timeLayout = "2006-01-02T15:04:05.000000Z"

// appendTime appends t as a JSON string in timeLayout, digit by digit (the
// layout is fixed; AppendFormat parses it for every call).
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		b = append(b, '"')
		b = t.AppendFormat(b, timeLayout)
		return append(b, '"')
	}
	hour, min, sec := t.Clock()
	var buf [29]byte // "2006-01-02T15:04:05.000000Z" and its quotes
	put := func(at, width, v int) {
		for i := at + width - 1; i >= at; i-- {
			buf[i] = byte('0' + v%10)
			v /= 10
		}
	}
	buf[0] = '"'
	put(1, 4, year)
	buf[5] = '-'
	put(6, 2, int(month))
	buf[8] = '-'
	put(9, 2, day)
	buf[11] = 'T'
	put(12, 2, hour)
	buf[14] = ':'
	put(15, 2, min)
	buf[17] = ':'
	put(18, 2, sec)
	buf[20] = '.'
	put(21, 6, t.Nanosecond()/1000)
	buf[27] = 'Z'
	buf[28] = '"'
	return append(b, buf[:]...)
}

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func formatMicros(us int64) string {
	if us == 0 {
		return ""
	}
	return formatTime(time.UnixMicro(us))
}
