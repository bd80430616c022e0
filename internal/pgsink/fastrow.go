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
//
// sc, when not nil, is reused over a batch's messages: the COPY line goes
// into its arena's spare capacity when it fits (a batch's lines then share
// one allocation; a line that outgrows it gets its own), and a message
// with the same keys in the same order as the last one takes that one's
// columns without looking them up again.
func (s *sink) fastRowOp(p *plan, m *broker.Message, sc *rowScratch) (op, bool) {
	raw := m.Data
	if len(p.meta) > 0 || !utf8.Valid(raw) {
		return op{}, false
	}
	type pair struct {
		key, val []byte
		at       int // its place among the message's writable pairs
	}
	var buf, sbuf [maxLayout]pair
	var keyBuf [maxLayout][]byte
	var wbuf [maxLayout]bool
	pairs, keys, writable := buf[:0], keyBuf[:0], wbuf[:0]
	same := sc != nil && sc.set != nil // so far, the last message's keys
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
		k := len(keys)
		if k == maxLayout {
			return op{}, false
		}
		var w bool
		if same && k < len(sc.keys) && bytes.Equal(sc.keys[k], key) {
			w = sc.writable[k]
		} else {
			same = false
			w = p.writable[string(key)]
		}
		keys, writable = append(keys, key), append(writable, w)
		if w {
			pairs = append(pairs, pair{key, raw[i:vend], len(pairs)})
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
	var set *colSet
	var convs []conv
	if same && len(keys) == len(sc.keys) {
		// The last message's layout: no repeated key, the same order.
		sorted := sbuf[:len(pairs)]
		for j, at := range sc.order {
			sorted[j] = pairs[at]
		}
		pairs, set, convs = sorted, sc.set, sc.convs
	} else {
		dups := false
		for a := 1; a < len(pairs); a++ {
			for b := 0; b < a; b++ {
				if bytes.Equal(pairs[a].key, pairs[b].key) {
					dups = true
				}
			}
		}
		if dups { // the last one wins, as in jsonb, in the first one's place
			kept := sbuf[:0]
			for a := range pairs {
				first := true
				for b := 0; b < len(kept); b++ {
					if bytes.Equal(kept[b].key, pairs[a].key) {
						kept[b].val, first = pairs[a].val, false
					}
				}
				if first {
					kept = append(kept, pairs[a])
				}
			}
			pairs = append(buf[:0], kept...)
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
		set = p.columnSet(colKey, func() []string {
			cols := make([]string, len(pairs))
			for j, pr := range pairs {
				cols[j] = string(pr.key)
			}
			return cols
		})
		convs = make([]conv, len(pairs))
		for j := range pairs {
			if convs[j] = p.copy.conv[set.cols[j]]; convs[j] == 0 {
				return op{}, false
			}
		}
		if sc != nil && !dups {
			sc.keys = append(sc.keys[:0], keys...)
			sc.writable = append(sc.writable[:0], writable...)
			sc.order = sc.order[:0]
			for _, pr := range pairs {
				sc.order = append(sc.order, pr.at)
			}
			sc.set, sc.convs = set, convs
		}
	}
	n := 0
	for _, pr := range pairs {
		n += len(pr.val) + 1
	}
	var row []byte
	start := 0
	inArena := sc != nil && cap(sc.arena)-len(sc.arena) >= n+8
	if inArena {
		start = len(sc.arena)
		row = sc.arena[start:start:cap(sc.arena)]
	} else {
		row = make([]byte, 0, n+8)
	}
	var scratch []byte
	for j, pr := range pairs {
		if j > 0 {
			row = append(row, '\t')
		}
		var ok bool
		if row, ok = appendField(row, convs[j], pr.val, &scratch); !ok {
			return op{}, false
		}
	}
	if inArena && len(row) > 0 && &row[0] == &sc.arena[start : start+1][0] {
		sc.arena = sc.arena[:start+len(row)] // still in place: keep it
	}
	row = row[:len(row):len(row)]
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

// maxLayout bounds the keys of a message fastRowOp takes.
const maxLayout = 32

// rowScratch is what fastRowOp reuses over one batch's messages.
type rowScratch struct {
	arena []byte // the COPY lines
	// the last message's layout: its keys in order, whether each is a
	// writable column, its writable pairs' places in column order, their
	// column set and conversions
	keys     [][]byte
	writable []bool
	order    []int
	set      *colSet
	convs    []conv
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
