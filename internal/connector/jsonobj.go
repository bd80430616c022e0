package connector

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/queen-mq/queen/internal/broker"
)

// invalidf is a refused document: 400 invalid_connector naming the JSON
// path of the field at fault.
func invalidf(field, format string, args ...any) *broker.Error {
	return &broker.Error{Code: "invalid_connector", Field: field, Message: fmt.Sprintf(format, args...)}
}

// obj is one JSON object of a document being read, with its path. Each
// accessor reports a wrong type with the field's path; a null counts as
// absent.
type obj struct {
	path string
	m    map[string]json.RawMessage
}

func (o obj) field(key string) string {
	if o.path == "" {
		return key
	}
	return o.path + "." + key
}

func parseObj(path string, raw json.RawMessage) (obj, *broker.Error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		what := path
		if what == "" {
			what = "the document"
		}
		return obj{}, invalidf(path, "%s must be a JSON object", what)
	}
	return obj{path: path, m: m}, nil
}

// only refuses keys outside allowed, naming the first unknown one (in
// sorted order, so the answer is stable).
func (o obj) only(allowed ...string) *broker.Error {
	var unknown []string
	for k := range o.m {
		found := false
		for _, a := range allowed {
			if k == a {
				found = true
				break
			}
		}
		if !found {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return invalidf(o.field(unknown[0]), "unknown field %q; the fields here are %s", unknown[0], strings.Join(allowed, ", "))
}

func (o obj) raw(key string) (json.RawMessage, bool) {
	v, ok := o.m[key]
	if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		return nil, false
	}
	return v, true
}

func (o obj) str(key string) (string, bool, *broker.Error) {
	v, ok := o.raw(key)
	if !ok {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false, invalidf(o.field(key), "%s must be a JSON string", o.field(key))
	}
	return s, true, nil
}

// integer reads a whole JSON number; 1.5 or "10" is refused, never rounded.
func (o obj) integer(key string) (int64, bool, *broker.Error) {
	v, ok := o.raw(key)
	if !ok {
		return 0, false, nil
	}
	if t := bytes.TrimSpace(v); len(t) == 0 || t[0] == '"' {
		return 0, false, invalidf(o.field(key), "%s must be a whole number, not a string", o.field(key))
	}
	var f json.Number
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	if err := d.Decode(&f); err != nil {
		return 0, false, invalidf(o.field(key), "%s must be a whole number", o.field(key))
	}
	if n, err := f.Int64(); err == nil {
		return n, true, nil
	}
	// 1e3 and 1000.0 are whole numbers too; 1.5 is not, and is refused
	// rather than rounded.
	x, err := f.Float64()
	if err != nil || x != math.Trunc(x) {
		return 0, false, invalidf(o.field(key), "%s must be a whole number, got %s", o.field(key), f)
	}
	if x >= math.MaxInt64 || x <= math.MinInt64 {
		return 0, false, invalidf(o.field(key), "%s is out of range, got %s", o.field(key), f)
	}
	return int64(x), true, nil
}

// intIn reads an integer in [lo, hi], or def when absent.
func (o obj) intIn(key string, def, lo, hi int64) (int, *broker.Error) {
	n, ok, e := o.integer(key)
	if e != nil {
		return 0, e
	}
	if !ok {
		return int(def), nil
	}
	if n < lo || n > hi {
		return 0, invalidf(o.field(key), "%s must be between %d and %d, got %d", o.field(key), lo, hi, n)
	}
	return int(n), nil
}

func (o obj) boolean(key string, def bool) (bool, *broker.Error) {
	v, ok := o.raw(key)
	if !ok {
		return def, nil
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		return false, invalidf(o.field(key), "%s must be true or false", o.field(key))
	}
	return b, nil
}

// oneOf reads a string among choices, or def when absent.
func (o obj) oneOf(key, def string, choices ...string) (string, *broker.Error) {
	s, ok, e := o.str(key)
	if e != nil {
		return "", e
	}
	if !ok {
		return def, nil
	}
	for _, c := range choices {
		if s == c {
			return s, nil
		}
	}
	return "", invalidf(o.field(key), "%s must be %s, got %q", o.field(key), orList(choices), s)
}

func (o obj) strList(key string) ([]string, bool, *broker.Error) {
	v, ok := o.raw(key)
	if !ok {
		return nil, false, nil
	}
	var l []string
	if err := json.Unmarshal(v, &l); err != nil {
		return nil, false, invalidf(o.field(key), "%s must be an array of strings", o.field(key))
	}
	return l, true, nil
}

func orList(choices []string) string {
	q := make([]string, len(choices))
	for i, c := range choices {
		q[i] = fmt.Sprintf("%q", c)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
