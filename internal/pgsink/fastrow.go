package pgsink

import (
	"bytes"
	"strings"
	"unicode/utf8"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// fastRowOp is rowOp for the common message of append and upsert on the
// COPY path, in one pass and few allocations: an object with plain keys,
// no metadata columns, every named column copyable. ok is false for
// anything else, which rowOp then maps the general way (with the same
// result for what both take).
func (s *sink) fastRowOp(p *plan, m *broker.Message) (op, bool) {
	raw := m.Data
	if len(p.meta) > 0 || !utf8.Valid(raw) {
		return op{}, false
	}
	type pair struct{ key, val []byte }
	var buf [24]pair
	pairs := buf[:0]
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return op{}, false
	}
	i = skipWS(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return op{}, false // no column named: DEFAULT VALUES, the general way
	}
	for {
		end, ok := checkString(raw, i)
		if !ok || bytes.IndexByte(raw[i+1:end-1], '\\') >= 0 {
			return op{}, false
		}
		key := raw[i+1 : end-1]
		i = skipWS(raw, end)
		if i >= len(raw) || raw[i] != ':' {
			return op{}, false
		}
		i = skipWS(raw, i+1)
		vend, ok := checkValue(raw, i, 1)
		if !ok {
			return op{}, false
		}
		if p.writable[string(key)] {
			dup := false
			for j := range pairs {
				if bytes.Equal(pairs[j].key, key) {
					pairs[j].val, dup = raw[i:vend], true // the last one wins, as in jsonb
				}
			}
			if !dup {
				if len(pairs) == len(buf) {
					return op{}, false
				}
				pairs = append(pairs, pair{key, raw[i:vend]})
			}
		}
		i = skipWS(raw, vend)
		if i >= len(raw) {
			return op{}, false
		}
		if raw[i] == '}' {
			if skipWS(raw, i+1) != len(raw) {
				return op{}, false
			}
			break
		}
		if raw[i] != ',' {
			return op{}, false
		}
		i = skipWS(raw, i+1)
	}
	if len(pairs) == 0 {
		return op{}, false
	}
	for a := 1; a < len(pairs); a++ { // few keys: insertion sort
		for b := a; b > 0 && bytes.Compare(pairs[b].key, pairs[b-1].key) < 0; b-- {
			pairs[b], pairs[b-1] = pairs[b-1], pairs[b]
		}
	}
	var kb [256]byte
	colKey := kb[:0]
	for j, pr := range pairs {
		if j > 0 {
			colKey = append(colKey, 0)
		}
		colKey = append(colKey, pr.key...)
	}
	set := p.columnSet(colKey, func() []string {
		cols := make([]string, len(pairs))
		for j, pr := range pairs {
			cols[j] = string(pr.key)
		}
		return cols
	})
	n := 0
	for _, pr := range pairs {
		n += len(pr.val) + 1
	}
	row := make([]byte, 0, n+8)
	var scratch []byte
	for j, pr := range pairs {
		cv := p.copy.conv[set.cols[j]]
		if cv == 0 {
			return op{}, false
		}
		if j > 0 {
			row = append(row, '\t')
		}
		var ok bool
		if row, ok = appendField(row, cv, pr.val, &scratch); !ok {
			return op{}, false
		}
	}
	o := op{kind: opInsert, cols: set.cols, colKey: set.key, doc: raw, copy: row}
	if s.spec.Mode == connector.ModeAppend {
		return o, true
	}
	// The key as keyOf writes it: a scalar token is its own compact form.
	var kbuf strings.Builder
	for _, k := range p.key {
		found := false
		for _, pr := range pairs {
			if string(pr.key) == k {
				if pr.val[0] == '{' || pr.val[0] == '[' || pr.val[0] == 'n' {
					return op{}, false
				}
				kbuf.Write(pr.val)
				kbuf.WriteByte(0)
				found = true
				break
			}
		}
		if !found {
			return op{}, false // rowOp refuses it with its sentence
		}
	}
	o.kind, o.key = opUpsert, kbuf.String()
	return o, true
}

// colSet is a set of columns messages name, shared by all their ops.
type colSet struct {
	cols []string
	key  string
}

// columnSet interns the column set whose joined names are key.
func (p *plan) columnSet(key []byte, cols func() []string) *colSet {
	p.setsMu.Lock()
	defer p.setsMu.Unlock()
	if cs, ok := p.sets[string(key)]; ok {
		return cs
	}
	if p.sets == nil {
		p.sets = map[string]*colSet{}
	}
	if len(p.sets) >= maxColumnSets {
		return &colSet{cols: cols(), key: string(key)}
	}
	cs := &colSet{cols: cols(), key: string(key)}
	p.sets[cs.key] = cs
	return cs
}

// maxColumnSets bounds the interned column sets of a plan.
const maxColumnSets = 1024
