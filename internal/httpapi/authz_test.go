package httpapi

import (
	"bytes"
	"context"
	"crypto"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/testkit"

	"github.com/queen-mq/queen/internal/auth"
	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
)

// Tests of authz.go: real HTTP against a real broker (embedded storage,
// single-voter raft), no mocks.

const authzSecret = "authz-test-secret-0123456789abcdef0123"

// The tokens of the test tokens file.
const (
	tokAlphaAdmin = "alpha-admin-token"
	tokAlphaWrite = "alpha-write-token"
	tokAlphaRead  = "alpha-read-token"
	tokBetaAdmin  = "beta-admin-token"
)

// authzBroker opens a single-node broker on a temporary data directory and
// waits until it leads.
func authzBroker(t testing.TB) *broker.Broker {
	t.Helper()
	b, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: t.TempDir(), RaftAddr: authzFreeAddr(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !b.Health().Leader {
		if ctx.Err() != nil {
			t.Fatal("no leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b
}

// authzServer serves a new broker over real HTTP with a, which may be nil
// (open mode).
func authzServer(t *testing.T, a *auth.Authenticator) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(New(authzBroker(t), Config{Auth: a}))
	t.Cleanup(srv.Close)
	return srv
}

// authzTokens writes a tokens file in the documented format and loads it
// through auth.New, as cmd/queen does; extra adds to the config.
func authzTokens(t *testing.T, extra auth.Config) *auth.Authenticator {
	t.Helper()
	line := func(tok, tenant, role string) string { return auth.HashToken(tok) + " " + tenant + " " + role + "\n" }
	file := "# test tokens\n" +
		line(tokAlphaAdmin, "alpha", "admin") +
		line(tokAlphaWrite, "alpha", "read-write") +
		line(tokAlphaRead, "alpha", "read") +
		"\n" + line(tokBetaAdmin, "beta", "admin") +
		line(tokOperator, "*", "operator")
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	extra.TokensFile = path
	a, err := auth.New(extra)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

type reply struct {
	status int
	body   []byte
	header http.Header
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("reply %d is not a JSON object: %q", r.status, r.body)
	}
	return m
}

// call sends one request; token "" sends no Authorization header.
func call(t *testing.T, srv *httptest.Server, method, path, token string, body any) reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, body: b, header: resp.Header}
}

// expect checks the status and returns the reply.
func expect(t *testing.T, want int, r reply, what string) reply {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: status %d, want %d; body %s", what, r.status, want, r.body)
	}
	return r
}

// expectError checks an error reply: status, code, a message, JSON type.
func expectError(t *testing.T, want int, code string, r reply, what string) {
	t.Helper()
	expect(t, want, r, what)
	m := r.json(t)
	if m["error"] != code || m["message"] == nil || m["message"] == "" {
		t.Fatalf("%s: body %s, want error %q with a message", what, r.body, code)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s: content-type %q", what, ct)
	}
}

func push(t *testing.T, srv *httptest.Server, token, queue string, payloads ...any) {
	t.Helper()
	var items []map[string]any
	for _, p := range payloads {
		items = append(items, map[string]any{"queue": queue, "payload": p})
	}
	expect(t, 201, call(t, srv, "POST", "/api/v1/push", token, map[string]any{"items": items}), "push as "+token)
}

type popped struct {
	Messages []struct {
		TransactionID string          `json:"transactionId"`
		PartitionID   string          `json:"partitionId"`
		LeaseID       string          `json:"leaseId"`
		Data          json.RawMessage `json:"data"`
	} `json:"messages"`
}

func pop(t *testing.T, srv *httptest.Server, token, path string) popped {
	t.Helper()
	r := call(t, srv, "GET", path, token, nil)
	var p popped
	if r.status == 204 {
		return p
	}
	expect(t, 200, r, "pop "+path)
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p popped) data() []string {
	var out []string
	for _, m := range p.Messages {
		out = append(out, string(m.Data))
	}
	sort.Strings(out)
	return out
}

func queueNames(t *testing.T, srv *httptest.Server, token string) []string {
	t.Helper()
	r := expect(t, 200, call(t, srv, "GET", "/api/v1/resources/queues", token, nil), "list queues")
	var body struct {
		Queues []struct {
			Name string `json:"name"`
		} `json:"queues"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range body.Queues {
		names = append(names, q.Name)
	}
	sort.Strings(names)
	return names
}

func dlqTotal(t *testing.T, srv *httptest.Server, token, query string) float64 {
	t.Helper()
	m := expect(t, 200, call(t, srv, "GET", "/api/v1/dlq"+query, token, nil), "dlq list").json(t)
	return m["total"].(float64)
}

// TestAuthzTenantIsolation: two tenants using the same queue name see
// only their own queues, messages, groups and dead letters, and one
// tenant's deletes never touch the other's.
func TestAuthzTenantIsolation(t *testing.T) {
	srv := authzServer(t, authzTokens(t, auth.Config{}))
	A, B := tokAlphaAdmin, tokBetaAdmin

	push(t, srv, A, "orders", map[string]string{"t": "A"})
	push(t, srv, B, "orders", map[string]string{"t": "B1"}, map[string]string{"t": "B2"})
	expect(t, 200, call(t, srv, "POST", "/api/v1/configure", B, map[string]any{"queue": "only-b"}), "configure only-b")

	// Listings.
	if got := strings.Join(queueNames(t, srv, A), ","); got != "orders" {
		t.Fatalf("alpha lists queues %q, want only its own orders", got)
	}
	if got := strings.Join(queueNames(t, srv, B), ","); got != "only-b,orders" {
		t.Fatalf("beta lists queues %q", got)
	}
	expectError(t, 404, "queue_not_found", call(t, srv, "GET", "/api/v1/resources/queues/only-b", A, nil), "alpha reads beta's queue")

	// Pops: each tenant gets only its own messages of "orders".
	pa := pop(t, srv, A, "/api/v1/pop/queue/orders?batch=10")
	if got := strings.Join(pa.data(), ","); got != `{"t":"A"}` {
		t.Fatalf("alpha popped %s", got)
	}
	pb := pop(t, srv, B, "/api/v1/pop/queue/orders?batch=10")
	if got := strings.Join(pb.data(), ","); got != `{"t":"B1"},{"t":"B2"}` {
		t.Fatalf("beta popped %s", got)
	}
	if p := pop(t, srv, A, "/api/v1/pop/queue/only-b?batch=10"); len(p.Messages) != 0 {
		t.Fatalf("alpha popped from beta's queue: %s", p.data())
	}

	// Alpha cannot ack or extend beta's leases even knowing their ids.
	mb := pb.Messages[0]
	r := expect(t, 200, call(t, srv, "POST", "/api/v1/ack", A, map[string]any{
		"transactionId": mb.TransactionID, "partitionId": mb.PartitionID, "leaseId": mb.LeaseID, "status": "dlq", "error": "by alpha"}), "alpha acks beta's message")
	var acks []map[string]any
	json.Unmarshal(r.body, &acks)
	if len(acks) != 1 || acks[0]["success"] == true {
		t.Fatalf("alpha acked beta's message: %s", r.body)
	}
	if r := call(t, srv, "POST", "/api/v1/lease/"+mb.LeaseID+"/extend", A, map[string]any{"seconds": 60}); r.status == 200 && strings.Contains(string(r.body), `"success":true`) {
		t.Fatalf("alpha extended beta's lease: %s", r.body)
	}

	// Dead letters: beta sends one message to its DLQ; alpha sees none.
	r = expect(t, 200, call(t, srv, "POST", "/api/v1/ack", B, map[string]any{
		"transactionId": mb.TransactionID, "partitionId": mb.PartitionID, "leaseId": mb.LeaseID, "status": "dlq", "error": "poison"}), "beta acks to dlq")
	if !strings.Contains(string(r.body), `"success":true`) {
		t.Fatalf("beta's dlq ack: %s", r.body)
	}
	if n := dlqTotal(t, srv, B, ""); n != 1 {
		t.Fatalf("beta's DLQ total = %v, want 1", n)
	}
	if n := dlqTotal(t, srv, A, ""); n != 0 {
		t.Fatalf("alpha's DLQ shows %v of beta's dead letters", n)
	}
	if n := dlqTotal(t, srv, A, "?queue=orders"); n != 0 {
		t.Fatalf("alpha's DLQ for orders shows %v of beta's dead letters", n)
	}
	call(t, srv, "DELETE", "/api/v1/dlq?queue=orders", A, nil)
	if n := dlqTotal(t, srv, B, "?queue=orders"); n != 1 {
		t.Fatalf("alpha emptying its DLQ changed beta's: total %v", n)
	}

	// Consumer groups.
	pop(t, srv, B, "/api/v1/pop/queue/orders?consumerGroup=beta-readers&subscriptionMode=all")
	if r := expect(t, 200, call(t, srv, "GET", "/api/v1/consumer-groups", A, nil), "alpha groups"); strings.Contains(string(r.body), "beta-readers") {
		t.Fatalf("alpha lists beta's group: %s", r.body)
	}
	if r := expect(t, 200, call(t, srv, "GET", "/api/v1/consumer-groups", B, nil), "beta groups"); !strings.Contains(string(r.body), "beta-readers") {
		t.Fatalf("beta does not list its group: %s", r.body)
	}
	expectError(t, 404, "group_not_found", call(t, srv, "DELETE", "/api/v1/consumer-groups/beta-readers", A, nil), "alpha deletes beta's group")

	// Deletes: alpha deleting "orders" and "only-b" leaves beta's alone.
	// Alpha's earlier pop of "only-b" created alpha's own (empty) queue of
	// that name, as any pop does; deleting it must not touch beta's.
	if r := call(t, srv, "DELETE", "/api/v1/resources/queues/only-b", A, nil); r.status != 200 && r.status != 404 {
		t.Fatalf("alpha deletes only-b: status %d %s", r.status, r.body)
	}
	expect(t, 200, call(t, srv, "DELETE", "/api/v1/resources/queues/orders", A, nil), "alpha deletes its orders")
	expectError(t, 404, "queue_not_found", call(t, srv, "GET", "/api/v1/resources/queues/orders", A, nil), "alpha's orders after delete")
	m := expect(t, 200, call(t, srv, "GET", "/api/v1/resources/queues/orders", B, nil), "beta's orders after alpha's delete").json(t)
	if msgs, _ := m["messages"].(map[string]any); msgs == nil || msgs["total"].(float64) < 1 {
		t.Fatalf("beta's orders lost messages when alpha deleted its own: %s", m)
	}
	if got := strings.Join(queueNames(t, srv, B), ","); got != "only-b,orders" {
		t.Fatalf("beta's queues after alpha's deletes: %q", got)
	}

	// KV keys are per tenant too (when the KV routes are present).
	if r := call(t, srv, "PUT", "/api/v1/kv/shared-key", A, map[string]any{"value": "alpha"}); r.status == 200 {
		if r := call(t, srv, "GET", "/api/v1/kv/shared-key", B, nil); r.status != 404 {
			t.Fatalf("beta reads alpha's KV key: %d %s", r.status, r.body)
		}
	} else {
		t.Logf("KV put answered %d %s; KV isolation not checked", r.status, r.body)
	}
}

// TestAuthzRoles: read can list but not write, write can push/pop/ack
// but not delete a queue, admin can.
func TestAuthzRoles(t *testing.T) {
	srv := authzServer(t, authzTokens(t, auth.Config{}))
	R, W, Adm := tokAlphaRead, tokAlphaWrite, tokAlphaAdmin
	push(t, srv, W, "q", "one", "two")

	// read
	expectError(t, 403, "forbidden", call(t, srv, "POST", "/api/v1/push", R, map[string]any{"items": []any{map[string]any{"queue": "q", "payload": 1}}}), "read token pushes")
	expectError(t, 403, "forbidden", call(t, srv, "POST", "/api/v1/configure", R, map[string]any{"queue": "q"}), "read token configures")
	expect(t, 200, call(t, srv, "GET", "/api/v1/resources/queues", R, nil), "read token lists queues")
	expect(t, 200, call(t, srv, "GET", "/api/v1/consumer-groups", R, nil), "read token lists groups")
	expect(t, 200, call(t, srv, "GET", "/api/v1/dlq", R, nil), "read token lists the DLQ")
	expect(t, 200, call(t, srv, "GET", "/status", R, nil), "read token reads status")

	// write
	p := pop(t, srv, W, "/api/v1/pop/queue/q?batch=1")
	if len(p.Messages) != 1 {
		t.Fatalf("write token popped %d messages", len(p.Messages))
	}
	m := p.Messages[0]
	r := expect(t, 200, call(t, srv, "POST", "/api/v1/ack", W, map[string]any{"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": m.LeaseID, "status": "completed"}), "write token acks")
	if !strings.Contains(string(r.body), `"success":true`) {
		t.Fatalf("ack: %s", r.body)
	}
	pop(t, srv, W, "/api/v1/pop/queue/q?consumerGroup=g&subscriptionMode=all&autoAck=true")
	expectError(t, 403, "forbidden", call(t, srv, "DELETE", "/api/v1/resources/queues/q", W, nil), "write token deletes a queue")
	expectError(t, 403, "forbidden", call(t, srv, "DELETE", "/api/v1/resources/%71ueues/q", W, nil), "write token deletes a queue, escaped path")
	expectError(t, 403, "forbidden", call(t, srv, "DELETE", "/api/v1/consumer-groups/g", W, nil), "write token deletes a group")
	expectError(t, 403, "forbidden", call(t, srv, "DELETE", "/api/v1/consumer-groups/g/queues/q", W, nil), "write token deletes a group's queue")
	expectError(t, 403, "forbidden", call(t, srv, "PUT", "/api/v1/connectors/c", W, map[string]any{}), "write token writes a connector")
	expectError(t, 403, "forbidden", call(t, srv, "POST", "/api/v1/cluster/join", W, map[string]any{"id": "n2", "address": "127.0.0.1:1"}), "write token joins a node")
	if got := queueNames(t, srv, R); strings.Join(got, ",") != "q" {
		t.Fatalf("queue q should survive the refused deletes: %q", got)
	}
	r = call(t, srv, "DELETE", "/api/v1/resources/queues/q", R, nil)
	expectError(t, 403, "forbidden", r, "read token deletes a queue")
	if !strings.Contains(r.json(t)["message"].(string), "admin") {
		t.Fatalf("403 message does not name the role needed: %s", r.body)
	}

	// admin
	expect(t, 200, call(t, srv, "DELETE", "/api/v1/consumer-groups/g", Adm, nil), "admin deletes a group")
	expect(t, 200, call(t, srv, "DELETE", "/api/v1/resources/queues/q", Adm, nil), "admin deletes a queue")
	if got := queueNames(t, srv, R); len(got) != 0 {
		t.Fatalf("queues after admin delete: %q", got)
	}
}

// TestAuthzUnauthenticated: missing or bad credentials get 401 with the
// error shape on every route but the open ones.
func TestAuthzUnauthenticated(t *testing.T) {
	now := time.Now()
	srv := authzServer(t, authzTokens(t, auth.Config{JWTSecret: authzSecret}))
	expired := hs256(map[string]any{"tenant": "alpha", "role": "admin", "exp": now.Add(-time.Hour).Unix()}, authzSecret)
	forged := hs256(map[string]any{"tenant": "alpha", "role": "admin"}, "not-the-secret-not-the-secret-xx")
	for _, tc := range []struct{ method, path, header string }{
		{"GET", "/api/v1/resources/queues", ""},
		{"POST", "/api/v1/push", ""},
		{"GET", "/api/v1/pop/queue/q", ""},
		{"DELETE", "/api/v1/resources/queues/q", ""},
		{"GET", "/status", ""},
		{"GET", "/no/such/route", ""},
		{"POST", "/health", ""},
		{"GET", "/api/v1/resources/queues", "Bearer wrong-token"},
		{"GET", "/api/v1/resources/queues", "Bearer " + tokAlphaAdmin + "x"},
		{"GET", "/api/v1/resources/queues", "Basic YWxwaGE6YWRtaW4="},
		{"GET", "/api/v1/resources/queues", tokAlphaAdmin},
		{"GET", "/api/v1/resources/queues", "Bearer " + expired},
		{"GET", "/api/v1/resources/queues", "Bearer " + forged},
		{"GET", "/api/v1/resources/queues", "Bearer eyJhbGciOiJub25lIn0.eyJ0ZW5hbnQiOiJhbHBoYSIsInJvbGUiOiJhZG1pbiJ9."},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		what := tc.method + " " + tc.path + " with " + tc.header[:min(len(tc.header), 12)]
		expectError(t, 401, "unauthorized", reply{resp.StatusCode, b, resp.Header}, what)
		if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: no WWW-Authenticate header", what)
		}
		if tc.header != "" && strings.Contains(string(b), strings.TrimPrefix(tc.header, "Bearer ")) {
			t.Errorf("%s: the reply echoes the credential: %s", what, b)
		}
	}
	// Open routes.
	r := expect(t, 200, call(t, srv, "GET", "/health", "", nil), "health without a token")
	if r.json(t)["status"] != "healthy" {
		t.Fatalf("health: %s", r.body)
	}
	expect(t, 200, call(t, srv, "HEAD", "/health", "", nil), "HEAD health without a token")
	if r := call(t, srv, "GET", "/metrics/prometheus", "", nil); r.status == 401 || r.status == 403 {
		t.Fatalf("/metrics/prometheus is not open: %d %s", r.status, r.body)
	}
	// A bad token on an open route does not matter.
	expect(t, 200, call(t, srv, "GET", "/health", "garbage", nil), "health with a bad token")
}

// TestAuthzJWT: HS256 and RS256 JWTs act in the tenant of their claim,
// alongside tokens-file tokens of the same tenant.
func TestAuthzJWT(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pubPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	srv := authzServer(t, authzTokens(t, auth.Config{JWTSecret: authzSecret, JWTPublicKey: pubPEM}))
	exp := time.Now().Add(time.Hour).Unix()

	alphaWriter := hs256(map[string]any{"tenant": "alpha", "role": "write", "exp": exp}, authzSecret)
	gammaReader := rs256(t, map[string]any{"tenant": "gamma", "role": "read-only", "exp": exp}, key)
	gammaAdmin := rs256(t, map[string]any{"tenant": "gamma", "role": "admin", "exp": exp}, key)

	push(t, srv, alphaWriter, "jwt-q", "from-jwt")
	if got := queueNames(t, srv, tokAlphaRead); strings.Join(got, ",") != "jwt-q" {
		t.Fatalf("alpha token does not see the queue alpha's JWT made: %q", got)
	}
	if got := queueNames(t, srv, gammaReader); len(got) != 0 {
		t.Fatalf("gamma sees %q", got)
	}
	expectError(t, 403, "forbidden", call(t, srv, "POST", "/api/v1/push", gammaReader, map[string]any{"items": []any{map[string]any{"queue": "g", "payload": 1}}}), "gamma reader pushes")
	push(t, srv, gammaAdmin, "g", 1)
	if got := queueNames(t, srv, gammaReader); strings.Join(got, ",") != "g" {
		t.Fatalf("gamma sees %q", got)
	}
	// HS256 signed with the RS256 public key (algorithm confusion) is refused.
	expectError(t, 401, "unauthorized", call(t, srv, "GET", "/api/v1/resources/queues", hs256(map[string]any{"tenant": "gamma", "role": "admin"}, pubPEM), nil), "HS256 signed with the public key")
}

// TestAuthzOpenMode: with nothing configured every request works without
// a token, in tenant "default".
func TestAuthzOpenMode(t *testing.T) {
	empty, err := auth.New(auth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]*auth.Authenticator{"nil": nil, "empty config": empty} {
		t.Run(name, func(t *testing.T) {
			srv := authzServer(t, a)
			push(t, srv, "", "open-q", "x")
			if got := queueNames(t, srv, ""); strings.Join(got, ",") != "open-q" {
				t.Fatalf("queues %q", got)
			}
			// A token is ignored, not refused: still tenant default.
			if got := queueNames(t, srv, "whatever"); strings.Join(got, ",") != "open-q" {
				t.Fatalf("queues with a token %q", got)
			}
			p := pop(t, srv, "", "/api/v1/pop/queue/open-q?autoAck=true")
			if len(p.Messages) != 1 {
				t.Fatalf("popped %d", len(p.Messages))
			}
			expect(t, 200, call(t, srv, "GET", "/status", "", nil), "status")
			expect(t, 200, call(t, srv, "DELETE", "/api/v1/resources/queues/open-q", "", nil), "delete queue")
			expect(t, 200, call(t, srv, "GET", "/health", "", nil), "health")
		})
	}
}

// TestRequiredRole checks the route table against the method rule,
// including spellings ServeMux routes to the same handler.
func TestRequiredRole(t *testing.T) {
	s := New(authzBroker(t), Config{})
	cases := []struct {
		method, path string
		want         auth.Role
	}{
		{"GET", "/api/v1/resources/queues", auth.RoleRead},
		{"HEAD", "/api/v1/resources/queues/q", auth.RoleRead},
		{"GET", "/api/v1/pop/queue/q", auth.RoleWrite},
		{"GET", "/api/v1/pop/queue/q/partition/p", auth.RoleWrite},
		{"GET", "/api/v1/resources/queues/q", auth.RoleRead},
		{"GET", "/api/v1/kv/a/b", auth.RoleRead},
		{"POST", "/api/v1/push", auth.RoleWrite},
		{"POST", "/api/v1/ack", auth.RoleWrite},
		{"POST", "/api/v1/configure", auth.RoleWrite},
		{"DELETE", "/api/v1/dlq", auth.RoleWrite},
		{"PUT", "/api/v1/kv/a/b", auth.RoleWrite},
		{"DELETE", "/api/v1/kv/x", auth.RoleWrite},
		{"POST", "/api/v1/transaction", auth.RoleWrite},
		{"OPTIONS", "/api/v1/push", auth.RoleWrite},
		{"POST", "/no/such/route", auth.RoleWrite},
		{"GET", "/no/such/route", auth.RoleRead},
		{"DELETE", "/api/v1/resources/queues/q", auth.RoleAdmin},
		{"DELETE", "/api/v1/resources/%71ueues/q", auth.RoleAdmin},
		{"DELETE", "/api/v1/resources/queues/a%2Fb", auth.RoleAdmin},
		{"DELETE", "/api/v1/resources/queues/", auth.RoleWrite},
		{"DELETE", "/api/v1/resources/queues/q/extra", auth.RoleWrite},
		{"DELETE", "/api/v1/consumer-groups/g", auth.RoleAdmin},
		{"DELETE", "/api/v1/consumer-groups/g/queues/q", auth.RoleAdmin},
		{"POST", "/api/v1/consumer-groups/g/queues/q/seek", auth.RoleWrite},
		{"GET", "/api/v1/connectors", auth.RoleRead},
		{"GET", "/api/v1/connectors/c", auth.RoleRead},
		{"POST", "/api/v1/connectors", auth.RoleWrite},
		{"PUT", "/api/v1/connectors/c", auth.RoleAdmin},
		{"DELETE", "/api/v1/connectors/c", auth.RoleAdmin},
		{"POST", "/api/v1/connectors/c/resync", auth.RoleAdmin},
		{"GET", "/api/v1/cluster", auth.RoleRead},
		{"POST", "/api/v1/cluster/join", auth.RoleOperator},
		{"DELETE", "/api/v1/cluster/members/n2", auth.RoleOperator},
	}
	for _, tc := range cases {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		if got := s.requiredRole(r); got != tc.want {
			t.Errorf("%s %s needs %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func hs256(claims map[string]any, secret string) string {
	c, _ := json.Marshal(claims)
	signed := b64([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + b64(c)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(signed))
	return signed + "." + b64(m.Sum(nil))
}

func rs256(t *testing.T, claims map[string]any, key *rsa.PrivateKey) string {
	c, _ := json.Marshal(claims)
	signed := b64([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + b64(c)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + b64(sig)
}

func authzFreeAddr(t testing.TB) string { return testkit.FreeAddr(t) }
