package pgsink

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/queen-mq/queen/internal/broker"
)

// param is one sql-mode parameter: a path into the message, or a fact.
type param struct {
	fact string    // "partition", "partitionId", ... ; "" for a path
	path []pathSeg // empty with fact == "": the whole message
}

type pathSeg struct {
	key   string
	index int // >= 0: an array element; -1: an object key
}

// parseParam reads "$", "$.a.b", "$.lines[0]", "$.a[1].b" or "@offset".
func parseParam(s string) (param, error) {
	if strings.HasPrefix(s, "@") {
		switch f := s[1:]; f {
		case "partition", "partitionId", "offset", "transactionId", "createdAt":
			return param{fact: f}, nil
		}
		return param{}, fmt.Errorf("param %q: use @partition, @partitionId, @offset, @transactionId or @createdAt", s)
	}
	if !strings.HasPrefix(s, "$") {
		return param{}, fmt.Errorf("param %q: a path starts with $ ($, $.a.b, $.lines[0])", s)
	}
	var p param
	rest := s[1:]
	for rest != "" {
		switch rest[0] {
		case '.':
			rest = rest[1:]
			end := strings.IndexAny(rest, ".[")
			if end < 0 {
				end = len(rest)
			}
			if end == 0 {
				return param{}, fmt.Errorf("param %q: an empty key after a dot", s)
			}
			p.path = append(p.path, pathSeg{key: rest[:end], index: -1})
			rest = rest[end:]
		case '[':
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return param{}, fmt.Errorf("param %q: [ without ]", s)
			}
			n, err := strconv.Atoi(rest[1:end])
			if err != nil || n < 0 {
				return param{}, fmt.Errorf("param %q: an array index is a number from 0", s)
			}
			p.path = append(p.path, pathSeg{index: n})
			rest = rest[end+1:]
		default:
			return param{}, fmt.Errorf("param %q: expected . or [ after %q", s, s[:len(s)-len(rest)])
		}
	}
	return p, nil
}

// value is the parameter's text for m: nil for SQL NULL (a missing path or
// a JSON null), a string's characters, or the JSON of anything else.
func (p param) value(m *broker.Message) ([]byte, error) {
	switch p.fact {
	case "partition":
		return []byte(m.Partition), nil
	case "partitionId":
		return strconv.AppendUint(nil, m.PartitionID, 10), nil
	case "offset":
		return strconv.AppendUint(nil, m.Offset, 10), nil
	case "transactionId":
		return []byte(m.TxID), nil
	case "createdAt":
		return []byte(m.CreatedAt.UTC().Format(timeLayout)), nil
	}
	raw := json.RawMessage(m.Data)
	for _, seg := range p.path {
		raw = bytes.TrimSpace(raw)
		if seg.index < 0 {
			if len(raw) == 0 || raw[0] != '{' {
				return nil, nil
			}
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil {
				return nil, refuse("the message is not valid JSON: " + err.Error())
			}
			v, ok := obj[seg.key]
			if !ok {
				return nil, nil
			}
			raw = v
		} else {
			if len(raw) == 0 || raw[0] != '[' {
				return nil, nil
			}
			var arr []json.RawMessage
			if err := json.Unmarshal(raw, &arr); err != nil {
				return nil, refuse("the message is not valid JSON: " + err.Error())
			}
			if seg.index >= len(arr) {
				return nil, nil
			}
			raw = arr[seg.index]
		}
	}
	return jsonText(raw)
}

// jsonText is a JSON value as SQL text: NULL for null, a string unquoted,
// anything else as written.
func jsonText(raw []byte) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, refuse("the message is not valid JSON: " + err.Error())
		}
		return []byte(s), nil
	}
	return raw, nil
}

// timeLayout is createdAt as a metadata value: UTC, microseconds.
const timeLayout = "2006-01-02T15:04:05.000000Z07:00"
