package pgsink

import (
	"bytes"
	"unicode/utf8"
)

// This file turns a message's values into COPY text that PostgreSQL reads
// into exactly the values jsonb_populate_record would give. It says no
// (the message takes the populate path) whenever it is not certain: a
// value PostgreSQL's jsonb input would refuse or normalise, or a shape
// only populate can map.

// conv is how a column's value goes into COPY text.
type conv uint8

const (
	convText  conv = iota + 1 // a string's characters, a number or boolean as written
	convJSON                  // json: the value as PostgreSQL prints a jsonb scalar
	convJSONB                 // jsonb: the value's JSON, parsed again by PostgreSQL
)

// maxCopyDepth bounds the nesting the COPY path takes; deeper messages go
// the populate way (PostgreSQL has a stack limit of its own).
const maxCopyDepth = 64

// maxCopyNumber bounds the length of a number the COPY path takes.
const maxCopyNumber = 100

// copyableJSON reports whether raw is one JSON value that PostgreSQL's
// jsonb input takes as this package reads it: valid UTF-8, the strict
// grammar, no \u0000 and no lone surrogate, no exponents (numeric
// normalises them) and no negative zero.
func copyableJSON(raw []byte) bool {
	if !utf8.Valid(raw) {
		return false
	}
	i := skipWS(raw, 0)
	end, ok := checkValue(raw, i, 0)
	return ok && skipWS(raw, end) == len(raw)
}

func checkValue(raw []byte, i, depth int) (int, bool) {
	if i >= len(raw) {
		return 0, false
	}
	switch c := raw[i]; {
	case c == '{' || c == '[':
		if depth >= maxCopyDepth {
			return 0, false
		}
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		i = skipWS(raw, i+1)
		if i < len(raw) && raw[i] == closing {
			return i + 1, true
		}
		for {
			if c == '{' {
				end, ok := checkString(raw, i)
				if !ok {
					return 0, false
				}
				i = skipWS(raw, end)
				if i >= len(raw) || raw[i] != ':' {
					return 0, false
				}
				i = skipWS(raw, i+1)
			}
			end, ok := checkValue(raw, i, depth+1)
			if !ok {
				return 0, false
			}
			i = skipWS(raw, end)
			if i >= len(raw) {
				return 0, false
			}
			if raw[i] == closing {
				return i + 1, true
			}
			if raw[i] != ',' {
				return 0, false
			}
			i = skipWS(raw, i+1)
		}
	case c == '"':
		return checkString(raw, i)
	case c == 't':
		return literal(raw, i, "true")
	case c == 'f':
		return literal(raw, i, "false")
	case c == 'n':
		return literal(raw, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		end, ok := plainNumber(raw, i)
		return end, ok
	}
	return 0, false
}

func literal(raw []byte, i int, word string) (int, bool) {
	end := i + len(word)
	if end > len(raw) || string(raw[i:end]) != word || (end < len(raw) && !delim(raw[end])) {
		return 0, false
	}
	return end, true
}

func delim(c byte) bool {
	return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

// plainNumber reads -?(0|[1-9][0-9]*)(\.[0-9]+)? and refuses exponents,
// negative zero and long numbers.
func plainNumber(raw []byte, i int) (int, bool) {
	j := i
	neg := j < len(raw) && raw[j] == '-'
	if neg {
		j++
	}
	if j >= len(raw) {
		return 0, false
	}
	nonzero := false
	switch {
	case raw[j] == '0':
		j++
	case raw[j] >= '1' && raw[j] <= '9':
		for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
			j++
		}
		nonzero = true
	default:
		return 0, false
	}
	if j < len(raw) && raw[j] == '.' {
		j++
		start := j
		for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
			if raw[j] != '0' {
				nonzero = true
			}
			j++
		}
		if j == start {
			return 0, false
		}
	}
	if j < len(raw) && !delim(raw[j]) {
		return 0, false // an exponent, a leading zero or garbage
	}
	if (neg && !nonzero) || j-i > maxCopyNumber {
		return 0, false
	}
	return j, true
}

// checkString reads a string at raw[i] == '"' under PostgreSQL's rules.
func checkString(raw []byte, i int) (int, bool) {
	if i >= len(raw) || raw[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(raw); j++ {
		c := raw[j]
		switch {
		case c == '"':
			return j + 1, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			if j+1 >= len(raw) {
				return 0, false
			}
			switch raw[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				r, n, ok := unicodeEscape(raw, j)
				if !ok || r == 0 {
					return 0, false
				}
				j += n - 1
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

// unicodeEscape reads \uXXXX (a surrogate pair as one) at raw[j] == '\\'
// and returns the rune and the bytes read; a lone surrogate is not ok.
func unicodeEscape(raw []byte, j int) (rune, int, bool) {
	r, ok := hex4(raw, j+2)
	if !ok {
		return 0, 0, false
	}
	if r < 0xD800 || r > 0xDFFF {
		return r, 6, true
	}
	if r > 0xDBFF || j+12 > len(raw) || raw[j+6] != '\\' || raw[j+7] != 'u' {
		return 0, 0, false
	}
	lo, ok := hex4(raw, j+8)
	if !ok || lo < 0xDC00 || lo > 0xDFFF {
		return 0, 0, false
	}
	return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), 12, true
}

func hex4(raw []byte, at int) (rune, bool) {
	if at+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[at : at+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, false
		}
	}
	return r, true
}

// appendString appends the characters of the JSON string v (already
// checked) to dst.
func appendString(dst, v []byte) []byte {
	body := v[1 : len(v)-1]
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		switch body[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, n, _ := unicodeEscape(body, i)
			dst = utf8.AppendRune(dst, r)
			i += n - 2
		default: // " \ /
			dst = append(dst, body[i+1])
		}
		i++
	}
	return dst
}

// appendJSONString appends s as PostgreSQL prints a JSON string (its
// escape_json): quotes, backslash, \b \f \n \r \t, other control
// characters as \u00xx, everything else as it is.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for _, c := range s {
		switch c {
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		default:
			if c < 0x20 {
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			} else {
				dst = append(dst, c)
			}
		}
	}
	return append(dst, '"')
}

// appendCopyEscaped appends s as one field of COPY's text format.
func appendCopyEscaped(dst, s []byte) []byte {
	for {
		i := bytes.IndexAny(s, "\\\n\r\t")
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		switch s[i] {
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		}
		s = s[i+1:]
	}
}

// appendField appends the COPY field of the JSON value v (from a message
// copyableJSON accepted) for a column converted by c, or says it cannot:
// then the message takes the populate path. scratch is reused.
func appendField(dst []byte, c conv, v []byte, scratch *[]byte) ([]byte, bool) {
	if len(v) == 0 {
		return dst, false
	}
	switch v[0] {
	case 'n':
		return append(dst, '\\', 'N'), true
	case '"':
		if bytes.IndexByte(v, '\\') < 0 {
			// No escapes, so no control characters either (checkString
			// refuses them raw): the characters are the body, PostgreSQL
			// prints the JSON string as it is, and nothing in it is special
			// to COPY.
			if c == convText {
				return append(dst, v[1:len(v)-1]...), true
			}
			return append(dst, v...), true
		}
		switch c {
		case convJSONB:
			return appendCopyEscaped(dst, v), true
		case convJSON:
			s := appendString((*scratch)[:0], v)
			j := appendJSONString(s[len(s):], s)
			*scratch = j[:0]
			return appendCopyEscaped(dst, j), true
		}
		s := appendString((*scratch)[:0], v)
		*scratch = s[:0]
		return appendCopyEscaped(dst, s), true
	case '{', '[':
		if c != convJSONB {
			return dst, false // populate prints it as jsonb first
		}
		return appendCopyEscaped(dst, v), true
	}
	// true, false or a plain number: the same characters in every type.
	return append(dst, v...), true
}
