package pgsink

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// param is one sql-mode parameter: a path into the message, or a fact.
type param struct {
	fact string               // "partition", "partitionId", ... ; "" for a path
	path []connector.PathStep // empty with fact == "": the whole message
}

// parseParam reads "$", "$.a.b", "$.lines[0]", "$.a[1].b" or "@offset"; the
// path grammar is the one the document's validation uses.
func parseParam(s string) (param, error) {
	if strings.HasPrefix(s, "@") {
		switch f := s[1:]; f {
		case "partition", "partitionId", "offset", "transactionId", "createdAt":
			return param{fact: f}, nil
		}
		return param{}, fmt.Errorf("param %q: use @partition, @partitionId, @offset, @transactionId or @createdAt", s)
	}
	steps, err := connector.ParsePath(s)
	if err != nil {
		return param{}, err
	}
	return param{path: steps}, nil
}

// value is the parameter's text for m: nil for SQL NULL (a missing path or
// a JSON null), a string's characters, or the JSON of anything else.
func (p param) value(m *broker.Delivery) ([]byte, error) {
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
		return []byte(time.UnixMicro(m.CreatedAt).UTC().Format(timeLayout)), nil
	}
	raw := json.RawMessage(m.Payload)
	for _, seg := range p.path {
		raw = bytes.TrimSpace(raw)
		if !seg.IsIndex {
			if len(raw) == 0 || raw[0] != '{' {
				return nil, nil
			}
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil {
				return nil, refuse("the message is not valid JSON: " + err.Error())
			}
			v, ok := obj[seg.Key]
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
			if seg.Index >= len(arr) {
				return nil, nil
			}
			raw = arr[seg.Index]
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
