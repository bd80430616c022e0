package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/queen-mq/queen/internal/broker"
)

// Every text the API takes (bodies, query parameters, path segments) must
// be valid UTF-8; anything else is refused with 400 naming the field, so
// two different byte strings never become one name, and what is stored is
// returned exactly.

// firstInvalidUTF8 returns the offset of the first byte that is not part
// of valid UTF-8, or -1.
func firstInvalidUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// checkBodyUTF8 refuses a body with invalid UTF-8 inside a JSON string.
// Bytes outside strings are a syntax error, which the decoder reports.
func checkBodyUTF8(body []byte) *broker.Error {
	i := firstInvalidUTF8(body)
	if i < 0 {
		return nil
	}
	path, inKey, ok := jsonPathAt(body, i+1)
	if !ok {
		return nil // not JSON up to there: the decoder reports that
	}
	what := orBody(path)
	if inKey {
		what = "a key of " + what
	}
	return &broker.Error{Code: "invalid_parameter", Field: path,
		Message: fmt.Sprintf("%s is not valid UTF-8 (byte 0x%02x at offset %d of the body); send text as UTF-8, and binary data encoded (base64, for example)", what, body[i], i)}
}

// checkRequestUTF8 refuses query parameters and path segments that are not
// valid UTF-8, naming the parameter or the route's segment.
func (s *Server) checkRequestUTF8(r *http.Request) *broker.Error {
	if !utf8.ValidString(r.URL.RawQuery) || strings.Contains(r.URL.RawQuery, "%") {
		for k, vs := range r.URL.Query() {
			if !utf8.ValidString(k) {
				return invalidText("query parameter "+strconvQuote(k), k)
			}
			for _, v := range vs {
				if !utf8.ValidString(v) {
					return invalidText(k, v)
				}
			}
		}
	}
	if utf8.ValidString(r.URL.Path) {
		return nil
	}
	_, pattern := s.mux.Handler(r)
	_, pp, _ := strings.Cut(pattern, " ")
	if pp == "" {
		pp = pattern
	}
	want := strings.Split(strings.TrimPrefix(pp, "/"), "/")
	got := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	for i, g := range got {
		seg, err := url.PathUnescape(g)
		if err != nil || utf8.ValidString(seg) {
			continue
		}
		name := "path"
		if i < len(want) {
			if w := want[i]; strings.HasPrefix(w, "{") {
				name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(w, "{"), "}"), "...")
			}
		} else if n := len(want); n > 0 && strings.HasSuffix(want[n-1], "...}") {
			name = strings.TrimSuffix(strings.TrimPrefix(want[n-1], "{"), "...}")
		}
		return invalidText(name, seg)
	}
	return invalidText("path", r.URL.Path)
}

func invalidText(field, v string) *broker.Error {
	i := firstInvalidUTF8([]byte(v))
	return &broker.Error{Code: "invalid_parameter", Field: field,
		Message: fmt.Sprintf("%s is not valid UTF-8 (byte 0x%02x at byte %d); percent-encode UTF-8 text", field, v[max(i, 0)], max(i, 0))}
}

func strconvQuote(s string) string { return fmt.Sprintf("%+q", s) }
