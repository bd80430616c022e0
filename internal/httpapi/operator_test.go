package httpapi

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/queen-mq/queen/internal/auth"
)

const tokOperator = "operator-token"

// operatorServer serves a broker whose tokens file has the tenant tokens
// of authzTokens and an operator token; HS256 JWTs are accepted too.
func operatorServer(t *testing.T) *httptest.Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(auth.HashToken(tokOperator)+" * operator\n"+auth.HashToken(tokAlphaAdmin)+" alpha admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Config{TokensFile: path, JWTSecret: authzSecret})
	if err != nil {
		t.Fatal(err)
	}
	return authzServer(t, a)
}

// TestAuthzOperator: over real HTTP, membership changes and checksums need
// the operator role (tokens file or JWT); a tenant's admin gets 403; the
// operator gets no tenant route.
func TestAuthzOperator(t *testing.T) {
	srv := operatorServer(t)
	adm := tokAlphaAdmin
	opJWT := hs256(map[string]any{"role": "operator"}, authzSecret)
	tenantJWT := hs256(map[string]any{"role": "admin", "tenant": "alpha"}, authzSecret)
	join := map[string]any{"id": "n9", "address": "127.0.0.1:1"}

	for _, tok := range []string{adm, tenantJWT} {
		r := call(t, srv, "POST", "/api/v1/cluster/join", tok, join)
		expectError(t, 403, "forbidden", r, "a tenant's admin joins a node")
		if !strings.Contains(r.json(t)["message"].(string), "operator") {
			t.Fatalf("403 does not name the operator role: %s", r.body)
		}
		expectError(t, 403, "forbidden", call(t, srv, "DELETE", "/api/v1/cluster/members/n9", tok, nil), "a tenant's admin removes a member")
		expectError(t, 403, "forbidden", call(t, srv, "GET", "/api/v1/cluster?checksum=true", tok, nil), "a tenant's admin reads checksums")
		expectError(t, 403, "forbidden", call(t, srv, "GET", "/api/v1/cluster?checksum=1", tok, nil), "a tenant's admin reads checksums (1)")
		r = expect(t, 200, call(t, srv, "GET", "/api/v1/cluster", tok, nil), "a tenant's admin reads the members")
		if strings.Contains(string(r.body), "checksum") {
			t.Fatalf("members without checksum=true carry a checksum: %s", r.body)
		}
	}
	if got := len(members(t, srv)); got != 1 {
		t.Fatalf("members after refused joins: %d", got)
	}

	for _, tok := range []string{tokOperator, opJWT} {
		r := expect(t, 200, call(t, srv, "GET", "/api/v1/cluster?checksum=true", tok, nil), "the operator reads checksums")
		if !strings.Contains(string(r.body), `"checksum":"`) {
			t.Fatalf("no checksum for the operator: %s", r.body)
		}
		// Let in, and refused by the cluster: nobody answers at the address.
		expectError(t, 503, "join_unreachable", call(t, srv, "POST", "/api/v1/cluster/join", tok, join), "the operator joins an unreachable node")
		expectError(t, 404, "member_not_found", call(t, srv, "DELETE", "/api/v1/cluster/members/n9", tok, nil), "the operator removes an absent member")
		// No tenant's routes.
		for _, rt := range [][2]string{{"GET", "/api/v1/resources/queues"}, {"POST", "/api/v1/push"}, {"GET", "/api/v1/pop/queue/q"}, {"DELETE", "/api/v1/resources/queues/q"}, {"GET", "/status"}} {
			var body any
			if rt[0] == "POST" {
				body = map[string]any{"items": []any{map[string]any{"queue": "q", "payload": 1}}}
			}
			r := call(t, srv, rt[0], rt[1], tok, body)
			expectError(t, 403, "forbidden", r, "the operator on "+rt[0]+" "+rt[1])
			if !strings.Contains(r.json(t)["message"].(string), "acts in no tenant") {
				t.Fatalf("403 for the operator does not say why: %s", r.body)
			}
		}
	}
	if got := len(members(t, srv)); got != 1 {
		t.Fatalf("members after the refused join: %d", got)
	}
}

func members(t *testing.T, srv *httptest.Server) []any {
	t.Helper()
	r := expect(t, 200, call(t, srv, "GET", "/api/v1/cluster", tokOperator, nil), "members")
	m, _ := r.json(t)["members"].([]any)
	return m
}
