package broker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"unicode/utf8"

	"github.com/queen-mq/queen/internal/state"
)

// Limits of names and requests (docs/http-api.md, "Conventions").
const (
	MaxNameLen      = 128
	MaxPartitionLen = 128
	MaxTxIDLen      = 256
	MaxBatch        = 10000
	MaxPartitions   = 10000
	MaxPushItems    = 10000
	MinLeaseSeconds = 5
	MaxLeaseSeconds = 3600
	MaxTimeoutMs    = 3600000

	// A queue's namespace and task, and the options without an effect
	// that Configure stores and every queue listing echoes.
	MaxLabelLen         = 256
	MaxExtraOptions     = 64
	MaxOptionNameLen    = 128
	MaxExtraOptionBytes = 4096
	MaxExtraOptionDepth = 8
)

// ValidName checks a queue or consumer group name: 1-128 bytes of
// [A-Za-z0-9._:-].
func ValidName(field, s string) *Error {
	if len(s) == 0 {
		return invalid(field, "%s must not be empty", field)
	}
	if len(s) > MaxNameLen {
		return invalid(field, "%s is %d bytes; at most %d are allowed", field, len(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			if c >= 0x80 {
				return invalid(field, "%s may contain only letters, digits and . _ : - (found byte 0x%02x at byte %d; names are ASCII)", field, c, i)
			}
			return invalid(field, "%s may contain only letters, digits and . _ : - (found %q at byte %d)", field, c, i)
		}
	}
	return nil
}

// ValidPartition checks a partition name: any UTF-8 of 0-128 bytes.
func ValidPartition(field, s string) *Error {
	if len(s) > MaxPartitionLen {
		return invalid(field, "%s is %d bytes; at most %d are allowed", field, len(s), MaxPartitionLen)
	}
	if !utf8.ValidString(s) {
		return invalid(field, "%s is not valid UTF-8", field)
	}
	return nil
}

func checkRange(field string, v, lo, hi int64) *Error {
	if v < lo || v > hi {
		return invalid(field, "%s must be between %d and %d, got %d", field, lo, hi, v)
	}
	return nil
}

func itemField(list string, i int, name string) string {
	return fmt.Sprintf("%s[%d].%s", list, i, name)
}

// validConfigure bounds what Configure stores beyond the options with an
// effect: namespace and task lengths, and the number, size and nesting of
// the extra options. The integer options must be JSON numbers.
func validConfigure(req ConfigureRequest) *Error {
	for _, l := range []struct {
		field string
		v     *string
	}{{"namespace", req.Namespace}, {"task", req.Task}} {
		if l.v == nil {
			continue
		}
		if len(*l.v) > MaxLabelLen {
			return invalid(l.field, "%s is %d bytes; at most %d are allowed", l.field, len(*l.v), MaxLabelLen)
		}
		if !utf8.ValidString(*l.v) {
			return invalid(l.field, "%s is not valid UTF-8", l.field)
		}
	}
	names := make([]string, 0, len(req.Options))
	for k := range req.Options {
		names = append(names, k)
	}
	sort.Strings(names)
	extra := 0
	for _, k := range names {
		v := bytes.TrimSpace(req.Options[k])
		field := "options." + k
		if _, ok := state.IntOptionRanges[k]; ok {
			if len(v) > 0 && v[0] == '"' {
				return invalid(field, "%s must be a JSON number, not a string: send %s, not %s", k, bytes.Trim(v, `"`), v)
			}
			continue
		}
		if k == "encryptionEnabled" || string(v) == "null" {
			continue
		}
		extra++
		if extra > MaxExtraOptions {
			return invalid("options", "at most %d options besides the documented ones are stored, got %d", MaxExtraOptions, countExtra(req.Options))
		}
		if len(k) > MaxOptionNameLen {
			return invalid("options", "an option name is at most %d bytes, got one of %d", MaxOptionNameLen, len(k))
		}
		if len(v) > MaxExtraOptionBytes {
			return invalid(field, "%s is %d bytes of JSON; an option value is at most %d", k, len(v), MaxExtraOptionBytes)
		}
		if d := jsonDepth(v); d > MaxExtraOptionDepth {
			return invalid(field, "%s nests arrays and objects %d deep; at most %d levels are allowed", k, d, MaxExtraOptionDepth)
		}
	}
	return nil
}

func countExtra(opts map[string]json.RawMessage) int {
	n := 0
	for k, v := range opts {
		if _, ok := state.IntOptionRanges[k]; !ok && k != "encryptionEnabled" && string(bytes.TrimSpace(v)) != "null" {
			n++
		}
	}
	return n
}

// jsonDepth is the deepest nesting of arrays and objects in a JSON value.
func jsonDepth(v []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}
