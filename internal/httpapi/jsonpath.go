package httpapi

import (
	"encoding/json"
	"strconv"
	"strings"
)

// jsonPathAt names the value of a JSON document at a byte offset, as
// "operations[2].items[5].queue": the innermost value whose bytes end at
// or contain off. inKey reports that off falls inside an object key (the
// path then names the object). ok is false when the document is not valid
// JSON up to there. Error replies use it to name the field; it never runs
// on a request that succeeds.
func jsonPathAt(body []byte, off int) (path string, inKey, ok bool) {
	w := &pathWalker{s: scan{b: body}, off: off}
	if !w.value(0) && !w.found {
		return "", false, false
	}
	if !w.found {
		return "", false, false
	}
	return w.result, w.inKey, true
}

type pathWalker struct {
	s      scan
	off    int
	path   []string
	found  bool
	inKey  bool
	result string
}

func (w *pathWalker) here() string {
	return strings.TrimPrefix(strings.Join(w.path, ""), ".")
}

// value walks one value; it returns false on a syntax error or once the
// target is found (w.found).
func (w *pathWalker) value(depth int) bool {
	if depth > 10000 {
		return false
	}
	s := &w.s
	c := s.peek()
	start := s.pos
	switch c {
	case '{':
		s.pos++
		if s.eat('}') {
			break
		}
		for {
			if s.peek() != '"' {
				return false
			}
			ks := s.pos
			if !s.skipString() {
				return false
			}
			if w.off > ks && w.off <= s.pos {
				w.found, w.inKey, w.result = true, true, w.here()
				return false
			}
			var key string
			if json.Unmarshal(s.b[ks:s.pos], &key) != nil {
				key = string(s.b[ks+1 : s.pos-1])
			}
			if !s.eat(':') {
				return false
			}
			w.path = append(w.path, "."+key)
			okv := w.value(depth + 1)
			w.path = w.path[:len(w.path)-1]
			if !okv {
				return false
			}
			if s.eat(',') {
				continue
			}
			if !s.eat('}') {
				return false
			}
			break
		}
	case '[':
		s.pos++
		if s.eat(']') {
			break
		}
		for i := 0; ; i++ {
			w.path = append(w.path, "["+strconv.Itoa(i)+"]")
			okv := w.value(depth + 1)
			w.path = w.path[:len(w.path)-1]
			if !okv {
				return false
			}
			if s.eat(',') {
				continue
			}
			if !s.eat(']') {
				return false
			}
			break
		}
	default:
		if _, ok := s.value(0); !ok {
			return false
		}
	}
	if w.off > start && w.off <= s.pos {
		// No child holds the offset (else the walk stopped there).
		w.found, w.result = true, w.here()
		return false
	}
	return true
}

// stripIndices turns "items[3].queue" into "items.queue", the form
// encoding/json uses.
func stripIndices(p string) string {
	var b strings.Builder
	depth := 0
	for i := 0; i < len(p); i++ {
		switch {
		case p[i] == '[':
			depth++
		case p[i] == ']':
			depth--
		case depth == 0:
			b.WriteByte(p[i])
		}
	}
	return b.String()
}
