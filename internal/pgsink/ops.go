package pgsink

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// opKind is what one write does to the table.
type opKind uint8

const (
	opInsert opKind = iota
	opUpsert
	opDelete
	opTruncate
	opSQL
)

// op is one write a message asks for. Ops of one kind over the same
// columns form a run, which is one statement.
type op struct {
	kind   opKind
	cols   []string // sorted: the columns written (insert, upsert) or matched (delete)
	colKey string   // cols joined, the run's identity
	key    string   // the key's values as written (upsert, delete): a run holds each key once
	doc    []byte   // the JSON object PostgreSQL populates a row from
	copy   []byte   // the row as a COPY text line, nil for the populate path
	params [][]byte // sql
}

// decode turns a message into its ops, or a refusal when the mode cannot
// read it.
func (s *sink) decode(p *plan, m *broker.Delivery) ([]op, error) {
	switch s.spec.Mode {
	case connector.ModeAppend, connector.ModeUpsert:
		if p.copy != nil {
			if o, ok := s.fastRowOp(p, m, nil); ok {
				return []op{o}, nil
			}
		}
		o, err := s.rowOp(p, m, m.Payload, nil)
		if err != nil {
			return nil, err
		}
		return []op{o}, nil
	case connector.ModeCDC:
		return s.cdcOps(p, m)
	case connector.ModeSQL:
		vals := make([][]byte, len(s.params))
		for i, prm := range s.params {
			v, err := prm.value(m)
			if err != nil {
				return nil, err
			}
			vals[i] = v
		}
		return []op{{kind: opSQL, params: vals}}, nil
	}
	return nil, fmt.Errorf("mode %q", s.spec.Mode)
}

// topKeys reads a JSON object's top-level keys and values; ok is false for
// anything that is not an object.
func topKeys(raw []byte) (map[string]json.RawMessage, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false, nil
	}
	obj := make(map[string]json.RawMessage, 8)
	if err := scanObject(raw, func(k string, v []byte) { obj[k] = v }); err != nil {
		var probe any
		if jerr := json.Unmarshal(raw, &probe); jerr != nil {
			return nil, false, refuse("the message is not valid JSON: " + jerr.Error())
		}
		return nil, false, refuse("the message is not valid JSON")
	}
	return obj, true, nil
}

func jsonKind(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "empty value"
	}
	switch raw[0] {
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// rowOp maps an object (the message, or a cdc event's after) onto the
// table: an insert in append mode, an upsert otherwise. skip lists columns
// to leave out (cdc's unchanged).
func (s *sink) rowOp(p *plan, m *broker.Delivery, raw []byte, skip map[string]bool) (op, error) {
	obj, isObj, err := topKeys(raw)
	if err != nil {
		return op{}, err
	}
	metaOnly := false
	if !isObj {
		if !s.hasPayloadColumn(p) {
			return op{}, refuse(fmt.Sprintf("the message is a JSON %s, not an object; %s mode maps an object's keys onto columns (store whole messages with sink.metadata.payload)", jsonKind(raw), s.spec.Mode))
		}
		metaOnly = true
	}
	cols := make([]string, 0, len(obj)+len(p.meta))
	for k := range obj {
		if p.writable[k] && !skip[k] {
			cols = append(cols, k)
		}
	}
	var doc []byte
	if s.spec.Mode == connector.ModeCDC || len(p.meta) == 0 {
		doc = raw
	} else {
		doc = s.withMeta(p, m, raw, metaOnly)
		for _, mc := range p.meta {
			if !slices.Contains(cols, mc.column) {
				cols = append(cols, mc.column)
			}
		}
	}
	sort.Strings(cols)
	o := op{kind: opInsert, cols: cols, colKey: strings.Join(cols, "\x00"), doc: doc}
	if p.copy != nil && s.spec.Mode != connector.ModeCDC && len(cols) > 0 && copyableJSON(raw) {
		var meta map[string][]byte
		if len(p.meta) > 0 {
			meta = s.metaJSON(p, m, raw)
		}
		var scratch []byte
		o.copy = copyRow(p.copy, cols, obj, meta, &scratch)
	}
	if s.spec.Mode == connector.ModeAppend {
		return o, nil
	}
	o.kind = opUpsert
	if o.key, err = keyOf(p.key, obj); err != nil {
		return op{}, err
	}
	return o, nil
}

// keyOf is the key's values as the message wrote them, or a refusal when
// one is missing.
func keyOf(key []string, obj map[string]json.RawMessage) (string, error) {
	var b strings.Builder
	for _, k := range key {
		v, ok := obj[k]
		if !ok || string(bytes.TrimSpace(v)) == "null" {
			return "", refuse(fmt.Sprintf("the message has no value for key column %q; every message of an upsert or cdc sink names its key", k))
		}
		var c bytes.Buffer
		if err := json.Compact(&c, v); err != nil {
			return "", refuse("the message is not valid JSON: " + err.Error())
		}
		b.Write(c.Bytes())
		b.WriteByte(0)
	}
	return b.String(), nil
}

func (s *sink) hasPayloadColumn(p *plan) bool {
	for _, mc := range p.meta {
		if mc.fact == "payload" {
			return true
		}
	}
	return false
}

// withMeta appends the metadata columns to the message's object (a later
// key wins in jsonb, so a metadata column overrides a key of the same name).
func (s *sink) withMeta(p *plan, m *broker.Delivery, raw []byte, metaOnly bool) []byte {
	raw = bytes.TrimSpace(raw)
	var b bytes.Buffer
	b.Grow(len(raw) + 64*len(p.meta))
	first := true
	if metaOnly {
		b.WriteByte('{')
	} else {
		inner := bytes.TrimSpace(raw[1 : len(raw)-1])
		b.Write(raw[:len(raw)-1])
		first = len(inner) == 0
	}
	for _, mc := range p.meta {
		if !first {
			b.WriteByte(',')
		}
		first = false
		col, _ := json.Marshal(mc.column)
		b.Write(col)
		b.WriteByte(':')
		switch mc.fact {
		case "partition":
			v, _ := json.Marshal(m.Partition)
			b.Write(v)
		case "partitionId":
			b.WriteString(strconv.FormatUint(m.PartitionID, 10))
		case "offset":
			b.WriteString(strconv.FormatUint(m.Offset, 10))
		case "transactionId":
			v, _ := json.Marshal(m.TxID)
			b.Write(v)
		case "createdAt":
			b.WriteByte('"')
			b.WriteString(time.UnixMicro(m.CreatedAt).UTC().Format(timeLayout))
			b.WriteByte('"')
		case "payload":
			b.Write(raw)
		}
	}
	b.WriteByte('}')
	return b.Bytes()
}

// event is a change event of the source.
type event struct {
	Op        string          `json:"op"`
	Key       json.RawMessage `json:"key"`
	After     json.RawMessage `json:"after"`
	Before    json.RawMessage `json:"before"`
	Unchanged []string        `json:"unchanged"`
}

// cdcOps applies a change event: c, r and u upsert after (u keeps its
// unchanged columns, and a changed key first deletes the old row), d
// deletes, t truncates.
func (s *sink) cdcOps(p *plan, m *broker.Delivery) ([]op, error) {
	var ev event
	if err := json.Unmarshal(m.Payload, &ev); err != nil {
		return nil, refuse("the message is not a change event (cdc mode reads {op, key, after, before}): " + err.Error())
	}
	switch ev.Op {
	case "c", "r", "u":
		var skip map[string]bool
		if len(ev.Unchanged) > 0 {
			skip = make(map[string]bool, len(ev.Unchanged))
			for _, c := range ev.Unchanged {
				skip[c] = true
			}
		}
		if _, ok, _ := topKeys(ev.After); !ok {
			return nil, refuse(fmt.Sprintf("a %q event without an object in after; cdc mode needs the new row in after", ev.Op))
		}
		up, err := s.rowOp(p, m, ev.After, skip)
		if err != nil {
			return nil, err
		}
		if ev.Op == "u" {
			if before, ok, _ := topKeys(ev.Before); ok {
				if old, err := keyOf(p.key, before); err == nil && old != up.key {
					del, err := s.deleteOp(p, ev.Before)
					if err != nil {
						return nil, err
					}
					return []op{del, up}, nil
				}
			}
		}
		return []op{up}, nil
	case "d":
		src := ev.Key
		if obj, ok, _ := topKeys(src); !ok || !hasAll(obj, p.key) {
			src = ev.Before
		}
		del, err := s.deleteOp(p, src)
		if err != nil {
			return nil, err
		}
		return []op{del}, nil
	case "t":
		return []op{{kind: opTruncate}}, nil
	}
	return nil, refuse(fmt.Sprintf("unknown change event op %q; cdc mode applies c, r, u, d and t", ev.Op))
}

func hasAll(obj map[string]json.RawMessage, key []string) bool {
	for _, k := range key {
		if _, ok := obj[k]; !ok {
			return false
		}
	}
	return true
}

func (s *sink) deleteOp(p *plan, raw []byte) (op, error) {
	obj, ok, err := topKeys(raw)
	if err != nil {
		return op{}, err
	}
	if !ok {
		return op{}, refuse("a delete event without its key; cdc mode needs the old key in key or before")
	}
	k, err := keyOf(p.key, obj)
	if err != nil {
		return op{}, err
	}
	cols := slices.Clone(p.key)
	sort.Strings(cols)
	return op{kind: opDelete, cols: cols, colKey: strings.Join(cols, "\x00"), key: k, doc: raw}, nil
}
