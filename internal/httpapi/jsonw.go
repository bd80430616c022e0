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

func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, timeLayout)
	return append(b, '"')
}

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func formatMicros(us int64) string {
	if us == 0 {
		return ""
	}
	return formatTime(time.UnixMicro(us))
}
