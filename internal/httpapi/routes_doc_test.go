package httpapi

import (
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// docRoutes reads the routes docs/http-api.md documents: every
// `METHOD /path` in backticks on a "### " heading.
func docRoutes(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../docs/http-api.md")
	if err != nil {
		t.Fatalf("the API reference is missing: %v", err)
	}
	re := regexp.MustCompile("`((?:GET|HEAD|POST|PUT|PATCH|DELETE) /[^`]*)`")
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "### ") {
			continue
		}
		for _, m := range re.FindAllStringSubmatch(line, -1) {
			out[normRoute(m[1])] = true
		}
	}
	if len(out) < 20 {
		t.Fatalf("docs/http-api.md documents only %d routes under ### headings", len(out))
	}
	return out
}

// normRoute erases wildcard names, so {q} and {queue} compare equal.
func normRoute(r string) string {
	method, path := splitPattern(r)
	return method + " " + erasePattern(path)
}

// TestRoutesDocumented: every route the router serves has a heading in
// docs/http-api.md, and every documented route is served.
func TestRoutesDocumented(t *testing.T) {
	s := New(authzBroker(t), Config{})
	served := map[string]string{}
	for _, p := range s.patterns {
		served[normRoute(p)] = p
	}
	if len(served) < 20 {
		t.Fatalf("the router registered only %d routes: %v", len(served), s.patterns)
	}
	doc := docRoutes(t)
	var missing, extra []string
	for n, p := range served {
		if !doc[n] {
			missing = append(missing, p)
		}
	}
	for n := range doc {
		if _, ok := served[n]; ok {
			continue
		}
		extra = append(extra, n)
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("routes served but not documented under a ### heading of docs/http-api.md:\n  %s", strings.Join(missing, "\n  "))
	}
	if len(extra) > 0 {
		t.Errorf("routes documented in docs/http-api.md that the router does not serve:\n  %s", strings.Join(extra, "\n  "))
	}

	// An unknown route points to the reference.
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	r := call(t, srv, "GET", "/api/v1/nope", "", nil)
	expectError(t, 404, "not_found", r, "unknown route")
	if msg, _ := r.json(t)["message"].(string); !strings.Contains(msg, "docs/http-api.md") || strings.Contains(msg, "API.md;") {
		t.Errorf("404 message %q does not point to docs/http-api.md", msg)
	}
}
