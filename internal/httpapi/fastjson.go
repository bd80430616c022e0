package httpapi

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/queen-mq/queen/internal/broker"
)

// The hot request bodies (push and ack batch) are decoded by a small
// hand-written scanner first. It handles the shapes clients send and gives
// up (ok = false) on anything it does not handle exactly like
// encoding/json: escapes in keys or field strings, keys that match a field
// only case-insensitively, wrong types, numbers it would have to interpret,
// and every error. The caller then decodes with encoding/json, which
// produces the result or the precise error. FuzzFastDecoders checks that
// whenever the fast path answers, encoding/json gives the same items.

type scan struct {
	b   []byte
	pos int
}

func (s *scan) ws() {
	for s.pos < len(s.b) {
		switch s.b[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte (0 at the end).
func (s *scan) peek() byte {
	s.ws()
	if s.pos < len(s.b) {
		return s.b[s.pos]
	}
	return 0
}

func (s *scan) eat(c byte) bool {
	if s.peek() == c {
		s.pos++
		return true
	}
	return false
}

// plainString reads a string without escapes; non-ASCII must be valid
// UTF-8 (encoding/json would replace invalid bytes).
func (s *scan) plainString() (string, bool) {
	v, ok := s.plainBytes()
	return string(v), ok
}

// plainBytes is plainString returning the string's bytes in the input (no
// copy); s.pos is then just after its closing quote.
func (s *scan) plainBytes() ([]byte, bool) {
	if !s.eat('"') {
		return nil, false
	}
	b, i := s.b, s.pos
	start, ascii := i, true
	for {
		for i < len(b) && plainASCII[b[i]] {
			i++
		}
		if i >= len(b) {
			return nil, false
		}
		switch c := b[i]; {
		case c == '"':
			v := b[start:i]
			s.pos = i + 1
			if !ascii && !utf8.Valid(v) {
				return nil, false
			}
			return v, true
		case c == '\\' || c < 0x20:
			return nil, false
		default: // not ASCII
			ascii = false
			i++
		}
	}
}

// plainASCII marks the bytes a plain string holds as they are: printable
// ASCII but the quote and the backslash.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// optString reads a plain string or null (nil).
func (s *scan) optString() (*string, bool) {
	if s.peek() == 'n' {
		return nil, s.literal("null")
	}
	v, ok := s.plainString()
	return &v, ok
}

// stringLike reads a plain string or null (isNull). A string equal to
// *last is answered with *last itself; a new one is remembered there.
func (s *scan) stringLike(last *string) (v string, isNull, ok bool) {
	if s.peek() == 'n' {
		return "", true, s.literal("null")
	}
	b, ok := s.plainBytes()
	if !ok {
		return "", false, false
	}
	if string(b) != *last {
		*last = string(b)
	}
	return *last, false, true
}

func (s *scan) literal(lit string) bool {
	if len(s.b)-s.pos < len(lit) || string(s.b[s.pos:s.pos+len(lit)]) != lit {
		return false
	}
	s.pos += len(lit)
	return true
}

// digits reads an unsigned decimal integer without sign, fraction or
// exponent that fits a uint64.
func (s *scan) digits() (uint64, bool) {
	start := s.pos
	for s.pos < len(s.b) && s.b[s.pos] >= '0' && s.b[s.pos] <= '9' {
		s.pos++
	}
	if s.pos == start || (s.b[start] == '0' && s.pos-start > 1) {
		return 0, false
	}
	if s.pos < len(s.b) {
		switch s.b[s.pos] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	var v uint64
	for _, c := range s.b[start:s.pos] {
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false // does not fit a uint64
		}
		v = v*10 + d
	}
	return v, true
}

// value skips one JSON value, checking its syntax, and returns its bytes.
func (s *scan) value(depth int) ([]byte, bool) {
	if depth > 200 {
		return nil, false
	}
	c := s.peek()
	start := s.pos
	switch {
	case c == '{':
		s.pos++
		if !s.eat('}') {
			for {
				if s.peek() != '"' || !s.skipString() {
					return nil, false
				}
				if !s.eat(':') {
					return nil, false
				}
				if _, ok := s.value(depth + 1); !ok {
					return nil, false
				}
				if s.eat(',') {
					continue
				}
				if !s.eat('}') {
					return nil, false
				}
				break
			}
		}
	case c == '[':
		s.pos++
		if !s.eat(']') {
			for {
				if _, ok := s.value(depth + 1); !ok {
					return nil, false
				}
				if s.eat(',') {
					continue
				}
				if !s.eat(']') {
					return nil, false
				}
				break
			}
		}
	case c == '"':
		if !s.skipString() {
			return nil, false
		}
	case c == '-' || (c >= '0' && c <= '9'):
		if !s.number() {
			return nil, false
		}
	case c == 't':
		if !s.literal("true") {
			return nil, false
		}
	case c == 'f':
		if !s.literal("false") {
			return nil, false
		}
	case c == 'n':
		if !s.literal("null") {
			return nil, false
		}
	default:
		return nil, false
	}
	return s.b[start:s.pos], true
}

// skipString checks a string's syntax (escapes included) and skips it. Raw
// bytes are kept as they are, as encoding/json does for a RawMessage.
func (s *scan) skipString() bool {
	s.pos++ // the opening quote
	for s.pos < len(s.b) {
		s.pos = skipPlain(s.b, s.pos)
		if s.pos >= len(s.b) {
			break
		}
		c := s.b[s.pos]
		switch {
		case c == '"':
			s.pos++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			s.pos++
			if s.pos >= len(s.b) {
				return false
			}
			switch s.b[s.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				if len(s.b)-s.pos < 5 {
					return false
				}
				for _, h := range s.b[s.pos+1 : s.pos+5] {
					if !isHex(h) {
						return false
					}
				}
				s.pos += 5
			default:
				return false
			}
		default:
			s.pos++
		}
	}
	return false
}

// skipPlain returns the offset of the first byte at or after i that ends
// or escapes a string or may not appear in one raw (a quote, a backslash, a
// control character), or len(b). It looks at eight bytes at a time: a
// payload's strings are most of a push's body.
func skipPlain(b []byte, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		q, bs := x^(ones*'"'), x^(ones*'\\')
		// A byte of q or bs is zero where x holds a quote or a backslash,
		// a byte of x below 0x20 is a control character; each test is
		// exact on whether any byte matches.
		if ((q-ones)&^q|(bs-ones)&^bs|(x-ones*0x20)&^x)&highs != 0 {
			break
		}
		i += 8
	}
	for i < len(b) {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
		i++
	}
	return i
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// number checks the JSON number grammar.
func (s *scan) number() bool {
	b, i := s.b, s.pos
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	s.pos = i
	return true
}

// key reads an object key and reports which of names it is (-1: none).
// A key that equals a name only when case is ignored gives up: encoding/json
// would match it, and the fast path does not copy that rule.
func (s *scan) key(names ...string) (int, bool) {
	k, ok := s.plainBytes()
	if !ok || !s.eat(':') {
		return 0, false
	}
	for i := 0; i < len(k); i++ {
		if k[i] >= 0x80 {
			return 0, false // Unicode case folding: leave it to encoding/json
		}
	}
	for i, n := range names {
		if string(k) == n {
			return i, true
		}
	}
	for _, n := range names {
		if len(k) == len(n) && equalFoldASCII(string(k), n) {
			return 0, false
		}
	}
	return -1, true
}

func equalFoldASCII(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x >= 'A' && x <= 'Z' {
			x += 'a' - 'A'
		}
		if y >= 'A' && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// object calls field for each key of an object; field reads the value.
func (s *scan) object(field func() bool) bool { return s.seq('{', '}', field) }

// array calls elem for each element of an array.
func (s *scan) array(elem func() bool) bool { return s.seq('[', ']', elem) }

// seq reads open, items separated by commas, and close; each reads one.
func (s *scan) seq(open, close byte, each func() bool) bool {
	if !s.eat(open) {
		return false
	}
	if s.eat(close) {
		return true
	}
	for {
		if !each() {
			return false
		}
		if s.eat(',') {
			continue
		}
		return s.eat(close)
	}
}

func (s *scan) end() bool {
	s.ws()
	return s.pos == len(s.b)
}

// fastPush decodes a push body; ok = false means "use encoding/json".
func fastPush(body []byte) (items []broker.PushItem, ok bool) {
	s := &scan{b: body}
	seen := false
	ok = s.object(func() bool {
		k, ok := s.key("items")
		switch {
		case !ok:
			return false
		case k < 0:
			_, ok = s.value(0)
			return ok
		}
		if seen || s.peek() != '[' {
			return false // null, a wrong type or a repeated key: the slow path
		}
		// Each item is an object: the count of braces (payloads may add
		// more) sizes the slice.
		seen, items = true, make([]broker.PushItem, 0, min(bytes.Count(body, []byte{'{'}), broker.MaxPushItems))
		// Most items of a push name the queue and partition of the one
		// before: those strings are shared, not made again.
		var lastQueue, lastPart string
		return s.array(func() bool {
			var txid, trace *string
			var queue, part string
			queueSet, partSet := false, false
			var payload []byte
			if !s.object(func() bool {
				k, ok := s.key("queue", "partition", "payload", "transactionId", "traceId")
				if !ok {
					return false
				}
				switch k {
				case -1:
					_, ok = s.value(0)
				case 0:
					var null bool
					queue, null, ok = s.stringLike(&lastQueue)
					queueSet = !null
				case 1:
					var null bool
					part, null, ok = s.stringLike(&lastPart)
					partSet = !null
				case 2:
					payload, ok = s.value(0)
				case 3:
					txid, ok = s.optString()
				case 4:
					trace, ok = s.optString()
				}
				return ok
			}) {
				return false
			}
			if !queueSet {
				return false
			}
			it := broker.PushItem{Queue: queue, Partition: broker.DefaultPartition, Payload: payload}
			if partSet {
				it.Partition = part
			}
			if len(it.Payload) == 0 {
				it.Payload = []byte("null")
			}
			if txid != nil {
				it.TxID = *txid
			}
			if trace != nil {
				it.TraceID = *trace
			}
			items = append(items, it)
			return true
		})
	}) && s.end() && seen
	return items, ok
}

// fastAckBatch decodes an ack batch body; ok = false means "use
// encoding/json". Its strings are substrings of one copy of the body and
// its offsets elements of a few slices: a batch of n acks costs a few
// allocations, not several per ack.
func fastAckBatch(body []byte) (items []broker.AckItem, ok bool) {
	s := &scan{b: body}
	whole := string(body)
	// Each ack is an object: the count of braces (a fast byte count)
	// sizes the slices, so they are not grown and copied as the items are
	// read.
	n := min(bytes.Count(body, []byte{'{'}), broker.MaxBatch)
	items = make([]broker.AckItem, 0, n)
	// str reads a plain string or null as a substring of whole.
	str := func() (v string, isNull bool, ok bool) {
		if s.peek() == 'n' {
			return "", true, s.literal("null")
		}
		b, ok := s.plainBytes()
		if !ok {
			return "", false, false
		}
		end := s.pos - 1
		return whole[end-len(b) : end], false, true
	}
	var group string
	hasGroup := false
	itemGroup := make([]bool, 0, n) // whether each item named its consumerGroup
	var offs []uint64
	seen := false
	ok = s.object(func() bool {
		k, ok := s.key("consumerGroup", "acknowledgments")
		switch {
		case !ok:
			return false
		case k < 0:
			_, ok = s.value(0)
			return ok
		case k == 0:
			var null bool
			group, null, ok = str()
			hasGroup = !null
			return ok
		}
		if seen || s.peek() != '[' {
			return false
		}
		seen, items, itemGroup = true, items[:0], itemGroup[:0]
		return s.array(func() bool {
			var a broker.AckItem
			var pid idValue
			named := false
			if !s.object(func() bool {
				k, ok := s.key("transactionId", "partitionId", "offset", "status", "consumerGroup", "leaseId", "error", "index")
				if !ok {
					return false
				}
				switch k {
				case -1:
					_, ok = s.value(0)
				case 0:
					a.TxID, _, ok = str()
				case 1:
					switch c := s.peek(); {
					case c == 'n':
						pid, ok = idValue{}, s.literal("null")
					case c == '"':
						s.pos++
						pid.v, ok = s.digits()
						pid.set = ok
						ok = ok && s.pos < len(s.b) && s.b[s.pos] == '"'
						s.pos++
					default:
						pid.v, ok = s.digits()
						pid.set = ok
					}
				case 2:
					if s.peek() == 'n' {
						a.Offset, ok = nil, s.literal("null")
					} else {
						var v uint64
						if v, ok = s.digits(); ok {
							if len(offs) == cap(offs) {
								offs = make([]uint64, 0, max(64, 2*cap(offs)))
							}
							offs = append(offs, v)
							a.Offset = &offs[len(offs)-1]
						}
					}
				case 3:
					a.Status, _, ok = str()
				case 4:
					var null bool
					a.Group, null, ok = str()
					named = !null
				case 5:
					a.LeaseID, _, ok = str()
				case 6:
					a.Error, _, ok = str()
				case 7:
					if c := s.peek(); c == 'n' {
						ok = s.literal("null")
					} else if c == '-' || (c >= '0' && c <= '9') {
						start := s.pos
						if ok = s.number(); ok {
							_, err := strconv.ParseFloat(string(s.b[start:s.pos]), 64)
							ok = err == nil
						}
					} else {
						ok = false
					}
				}
				return ok
			}) {
				return false
			}
			a.PartitionID = pid.v
			items = append(items, a)
			itemGroup = append(itemGroup, named)
			return true
		})
	}) && s.end() && seen
	if !ok {
		return nil, false
	}
	if items == nil {
		items = []broker.AckItem{}
	}
	// The batch's consumerGroup (wherever it stands in the body) fills an
	// item that names none, and overrides every item when it is not empty.
	for i := range items {
		if hasGroup && (!itemGroup[i] || group != "") {
			items[i].Group = group
		}
	}
	return items, true
}
