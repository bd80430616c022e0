package pgsink

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
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
func (s *sink) fastRowOp(p *plan, m *broker.Delivery, sc *rowScratch) (op, bool) {
	raw := m.Payload
	// No utf8.Valid pass over the message: every byte outside a string is
	// ASCII the grammar below checks, and each string (key or value) is
	// checked where it is read, when it has a byte above 0x7f.
	if len(p.meta) > 0 || len(raw) > math.MaxInt32 {
		return op{}, false
	}
	key := func(pr pair) []byte { return raw[pr.ks:pr.ke] }
	val := func(pr pair) []byte { return raw[pr.vs:pr.ve] }
	// The per-message arrays live in the batch's scratch (not zeroed for
	// every message); alone, in a fresh one.
	var lb *layoutBuf
	if sc != nil {
		lb = &sc.lb
	} else {
		lb = new(layoutBuf)
	}
	nk, np := 0, 0                     // the keys and writable pairs read so far, in lb
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
		k := nk
		if k == maxLayout {
			return op{}, false
		}
		var end int
		matched := same && k < len(sc.keys) && sameKey(raw, i, sc.keys[k])
		if matched {
			// The last message's key here, which plainString took: so
			// would it this one, up to the same quote.
			end = i + len(sc.keys[k]) + 2
		} else {
			var st plainStatus
			var high bool
			if end, st, high = plainStringHigh(raw, i); st != plainOK || (high && !utf8.Valid(raw[i+1:end-1])) {
				return op{}, false // a key with an escape: the general way
			}
		}
		ks, ke := int32(i+1), int32(end-1)
		key := raw[ks:ke]
		i = skipWS(raw, end)
		if i >= len(raw) || raw[i] != ':' {
			return op{}, false
		}
		i = skipWS(raw, i+1)
		var vend int
		vst := plainEscaped // not a string: checkValue decides
		if i < len(raw) && raw[i] == '"' {
			var high bool
			if vend, vst, high = plainStringHigh(raw, i); vst == plainBad || (vst == plainOK && high && !utf8.Valid(raw[i+1:vend-1])) {
				return op{}, false
			}
		}
		if vst == plainEscaped {
			var ok bool
			if vend, ok = checkValue(raw, i, 1); !ok || !utf8.Valid(raw[i:vend]) {
				return op{}, false
			}
		}
		var w bool
		if matched {
			w = sc.writable[k]
		} else {
			same = false
			w = p.writable[string(key)]
		}
		lb.keys[k], lb.writable[k] = [2]int32{ks, ke}, w
		nk++
		if w {
			lb.pairs[np] = pair{ks, ke, int32(i), int32(vend), int32(np), vst == plainOK}
			np++
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
	if np == 0 {
		return op{}, false
	}
	pairs, keys, writable := lb.pairs[:np], lb.keys[:nk], lb.writable[:nk]
	var set *colSet
	var convs []conv
	if same && len(keys) == len(sc.keys) {
		// The last message's layout: no repeated key, the same order.
		sorted := lb.sorted[:len(pairs)]
		for j, at := range sc.order {
			sorted[j] = pairs[at]
		}
		pairs, set, convs = sorted, sc.set, sc.convs
	} else {
		dups := false
		for a := 1; a < len(pairs); a++ {
			for b := 0; b < a; b++ {
				if bytes.Equal(key(pairs[a]), key(pairs[b])) {
					dups = true
				}
			}
		}
		if dups { // the last one wins, as in jsonb, in the first one's place
			kept := lb.sorted[:0]
			for a := range pairs {
				first := true
				for b := 0; b < len(kept); b++ {
					if bytes.Equal(key(kept[b]), key(pairs[a])) {
						kept[b].vs, kept[b].ve, kept[b].plain, first = pairs[a].vs, pairs[a].ve, pairs[a].plain, false
					}
				}
				if first {
					kept = append(kept, pairs[a])
				}
			}
			pairs = append(lb.pairs[:0], kept...)
		}
		for a := 1; a < len(pairs); a++ { // few keys: insertion sort
			for b := a; b > 0 && bytes.Compare(key(pairs[b]), key(pairs[b-1])) < 0; b-- {
				pairs[b], pairs[b-1] = pairs[b-1], pairs[b]
			}
		}
		var kb [256]byte
		colKey := kb[:0]
		for j, pr := range pairs {
			if j > 0 {
				colKey = append(colKey, 0)
			}
			colKey = append(colKey, key(pr)...)
		}
		set = p.columnSet(colKey, func() []string {
			cols := make([]string, len(pairs))
			for j, pr := range pairs {
				cols[j] = string(key(pr))
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
			sc.keys = slices.Grow(sc.keys[:0], len(keys))
			for _, k := range keys {
				sc.keys = append(sc.keys, raw[k[0]:k[1]])
			}
			sc.writable = append(sc.writable[:0], writable...)
			sc.order = sc.order[:0]
			for _, pr := range pairs {
				sc.order = append(sc.order, int(pr.at))
			}
			sc.set, sc.convs = set, convs
		}
	}
	n := 0
	for _, pr := range pairs {
		n += int(pr.ve-pr.vs) + 1
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
		if pr.plain {
			// A string plainString took: no escapes, so nothing in it is
			// special to COPY (appendField's own first case, without
			// looking for a backslash again).
			v := val(pr)
			if convs[j] == convText {
				v = v[1 : len(v)-1]
			}
			row = append(row, v...)
			continue
		}
		var ok bool
		if row, ok = appendField(row, convs[j], val(pr), &scratch); !ok {
			return op{}, false
		}
	}
	inPlace := inArena && len(row) > 0 && &row[0] == &sc.arena[start : start+1][0]
	switch {
	case inPlace && len(row) < cap(sc.arena)-start:
		// Still in place, with room for its newline: kept, the newline
		// after it, so that a run of lines that lie one after the other
		// is COPY data as it is (contiguousLines). The line's capacity
		// runs on over the lines after it, which nothing appends to.
		sc.arena = append(sc.arena[:start+len(row)], '\n')
	case inPlace:
		sc.arena = sc.arena[:start+len(row)] // the arena is full
		row = row[:len(row):len(row)]
	default:
		row = row[:len(row):len(row)]
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
			if string(key(pr)) == k {
				if v := val(pr); v[0] == '{' || v[0] == '[' || v[0] == 'n' {
					return op{}, false
				}
				kbuf.Write(val(pr))
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

// plainStatus is what plainString found.
type plainStatus uint8

const (
	plainOK      plainStatus = iota // a string without escapes, valid
	plainEscaped                    // a backslash before the first quote: checkString decides
	plainBad                        // not a valid string under checkString's rules
)

// plainString reads a string at raw[i] == '"' as checkString does when it
// has no backslash, many bytes at a time: the first quote ends it, and no
// byte before it may be a control character. With a backslash before that
// quote it says plainEscaped and leaves the string to checkString.
func plainString(raw []byte, i int) (int, plainStatus) {
	end, st, _ := plainStringHigh(raw, i)
	return end, st
}

// plainStringHigh is plainString that also says, for plainOK, whether the
// body has a byte above 0x7f (whose UTF-8 the caller checks). One pass
// finds the first quote, backslash or control character; a control
// character before a backslash makes it plainBad where checkString fails
// too.
func plainStringHigh(raw []byte, i int) (int, plainStatus, bool) {
	if i >= len(raw) || raw[i] != '"' {
		return 0, plainBad, false
	}
	j, high := stringStop(raw, i+1)
	switch {
	case j >= len(raw):
		return 0, plainBad, false // no closing quote
	case raw[j] == '"':
		return j + 1, plainOK, high
	case raw[j] == '\\' && bytes.IndexByte(raw[j:], '"') >= 0:
		return 0, plainEscaped, false
	}
	return 0, plainBad, false // a control character, or no quote after the backslash
}

// stringStop returns the place of the first quote, backslash or byte
// below 0x20 in raw from j on (len(raw) if there is none), eight bytes at
// a time, and whether a byte above 0x7f comes before it.
func stringStop(raw []byte, j int) (int, bool) {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	var hi uint64
	for ; j+8 <= len(raw); j += 8 {
		x := binary.LittleEndian.Uint64(raw[j:])
		// A byte that is a quote, a backslash or below 0x20 sets its high
		// bit in t; a byte above one that does may too (a borrow), so the
		// lowest one set is the first such byte.
		q, b := x^(0x22*ones), x^(0x5c*ones)
		t := ((q-ones)&^q | (b-ones)&^b | (x-0x20*ones)&^x) & highs
		if t != 0 {
			k := bits.TrailingZeros64(t) / 8
			hi |= x & (1<<(8*k) - 1)
			return j + k, hi&highs != 0
		}
		hi |= x
	}
	for ; j < len(raw); j++ {
		c := raw[j]
		if c == '"' || c == '\\' || c < 0x20 {
			break
		}
		hi |= uint64(c)
	}
	return j, hi&highs != 0
}

// sameKey says whether raw[i:] starts with key as a JSON string: a quote,
// key's bytes, a quote.
func sameKey(raw []byte, i int, key []byte) bool {
	e := i + len(key) + 1
	return e < len(raw) && raw[i] == '"' && raw[e] == '"' && bytes.Equal(raw[i+1:e], key)
}

// maxLayout bounds the keys of a message fastRowOp takes.
const maxLayout = 32

// pair is a key's and value's places in a message: offsets rather than
// slices keep layoutBuf small.
type pair struct {
	ks, ke, vs, ve int32
	at             int32 // its place among the message's writable pairs
	plain          bool  // the value is a string plainString took
}

// layoutBuf is fastRowOp's per-message arrays.
type layoutBuf struct {
	pairs, sorted [maxLayout]pair
	keys          [maxLayout][2]int32
	writable      [maxLayout]bool
}

// rowScratch is what fastRowOp reuses over one batch's messages.
type rowScratch struct {
	lb    layoutBuf
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

// reset empties the scratch for a new batch: the last layout's keys are
// pieces of the batch before's messages, whose storage is not this
// package's to keep.
func (sc *rowScratch) reset() {
	sc.arena = sc.arena[:0]
	clear(sc.keys)
	sc.keys, sc.writable, sc.order = sc.keys[:0], sc.writable[:0], sc.order[:0]
	sc.set, sc.convs = nil, nil
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
