package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/auth"
	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/testkit"
)

// Tests of the connector routes and the runtime behind them: real HTTP,
// a real broker, the real runtime. The connectors themselves are a test
// Factory (this tests the framework, not PostgreSQL).

const testKey = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

// fakeRuns records what the test Factory's runners did.
type fakeRuns struct {
	mu      sync.Mutex
	running map[string]fakeRun // tenant/name -> the live run
	started []fakeRun
	stopped []fakeRun
	fail    map[string]error // name -> error its Run returns
}

type fakeRun struct {
	Tenant, Name, Password string
	Version                uint64
	Deleting               bool
}

func newFakeRuns() *fakeRuns {
	return &fakeRuns{running: map[string]fakeRun{}, fail: map[string]error{}}
}

func (f *fakeRuns) factory(phase string) connector.Factory {
	return func(env connector.Env) (connector.Runner, error) {
		return &fakeRunner{f: f, env: env, phase: phase}, nil
	}
}

type fakeRunner struct {
	f     *fakeRuns
	env   connector.Env
	phase string
}

func (r *fakeRunner) Run(ctx context.Context) error {
	run := fakeRun{Tenant: r.env.Tenant, Name: r.env.Doc.Name, Password: r.env.Password, Version: r.env.Doc.Version, Deleting: r.env.Doc.Deleting}
	k := run.Tenant + "/" + run.Name
	r.f.mu.Lock()
	err := r.f.fail[run.Name]
	r.f.started = append(r.f.started, run)
	r.f.running[k] = run
	r.f.mu.Unlock()
	defer func() {
		r.f.mu.Lock()
		delete(r.f.running, k)
		r.f.stopped = append(r.f.stopped, run)
		r.f.mu.Unlock()
	}()
	if err != nil {
		return err
	}
	if run.Name == "panics" {
		panic("a bug in a connector")
	}
	if run.Deleting {
		// A source's owner drops its slot, then removes the document.
		return r.env.Remove(ctx)
	}
	if r.env.Doc.Kind == connector.KindSource {
		// Own the source, and leave giving the lease back to the runtime.
		if held, holder, err := r.env.NewLease().Acquire(ctx); err != nil || !held {
			return fmt.Errorf("lease: held=%v holder=%q: %v", held, holder, err)
		}
	}
	r.env.Status.SetPhase(r.phase)
	r.env.Metrics.Owner.Set(1)
	r.env.Metrics.SinkApplied.Add(3)
	<-ctx.Done()
	return nil
}

func (f *fakeRuns) live(k string) (fakeRun, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.running[k]
	return r, ok
}

func (f *fakeRuns) startedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.started)
}

type connEnv struct {
	srv  *httptest.Server
	b    *broker.Broker
	rt   *connector.Runtime
	runs *fakeRuns
}

type connOpts struct {
	key      string
	auth     *auth.Authenticator
	disabled bool
	dataDir  string
}

func connTestServer(t *testing.T, o connOpts) *connEnv {
	t.Helper()
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}
	b, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: o.dataDir, RaftAddr: testkit.FreeAddr(t)}, EncryptionKey: o.key})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	runs := newFakeRuns()
	st := connector.DefaultSettings()
	st.Reload = 100 * time.Millisecond
	st.ShutdownGrace = 5 * time.Second
	st.Enabled = !o.disabled
	rt := connector.NewRuntime(connector.RuntimeConfig{Broker: b, Settings: st,
		Factories: map[string]connector.Factory{connector.KindSource: runs.factory(connector.PhaseStreaming), connector.KindSink: runs.factory(connector.PhaseRunning)}})
	srv := httptest.NewServer(New(b, Config{Auth: o.auth, Connectors: rt}))
	rt.Start()
	e := &connEnv{srv: srv, b: b, rt: rt, runs: runs}
	t.Cleanup(func() {
		srv.Close()
		rt.Stop()
		b.Close()
	})
	return e
}

func srcBody(password any) map[string]any {
	conn := map[string]any{"host": "pg.example.com", "database": "app", "user": "cdc"}
	if password != nil {
		conn["password"] = password
	}
	return map[string]any{"kind": "source", "connection": conn,
		"source": map[string]any{"tables": []any{map[string]any{"table": "public.orders", "queue": "orders"}}}}
}

func sinkBody(password any) map[string]any {
	conn := map[string]any{"host": "pg.example.com", "database": "app", "user": "w"}
	if password != nil {
		conn["password"] = password
	}
	return map[string]any{"kind": "sink", "connection": conn,
		"sink": map[string]any{"queue": "orders", "table": "public.orders_copy", "mode": "append"}}
}

func getPath(m map[string]any, path string) any {
	var cur any = m
	for _, p := range strings.Split(path, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	if err := testkit.CheckFor(10*time.Second, 20*time.Millisecond, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func TestConnectorRoutes(t *testing.T) {
	e := connTestServer(t, connOpts{key: testKey})
	s := e.srv

	expectError(t, 404, "connector_not_found", call(t, s, "GET", "/api/v1/connectors/nope", "", nil), "get a missing connector")
	expectError(t, 404, "connector_not_found", call(t, s, "DELETE", "/api/v1/connectors/nope", "", nil), "delete a missing connector")
	expectError(t, 404, "connector_not_found", call(t, s, "POST", "/api/v1/connectors/nope/resync", "", nil), "resync a missing connector")
	expectError(t, 404, "connector_not_found", call(t, s, "GET", "/api/v1/connectors/Bad.Name", "", nil), "get a name that breaks the rule")
	expectError(t, 400, "invalid_connector", call(t, s, "PUT", "/api/v1/connectors/Bad.Name", "", srcBody("pw")), "put a bad name")

	// A refused document names the field and stores nothing.
	bad := srcBody("pw")
	bad["source"].(map[string]any)["lingerMs"] = 5001
	r := call(t, s, "PUT", "/api/v1/connectors/src", "", bad)
	expectError(t, 400, "invalid_connector", r, "lingerMs 5001")
	if f := r.json(t)["field"]; f != "source.lingerMs" {
		t.Fatalf("field %v, want source.lingerMs", f)
	}
	expectError(t, 404, "connector_not_found", call(t, s, "GET", "/api/v1/connectors/src", "", nil), "a refused document is not stored")
	r = call(t, s, "PUT", "/api/v1/connectors/src", "", `{"kind":`)
	if r.status != 400 {
		t.Fatalf("a body that is a JSON string: %d %s", r.status, r.body)
	}

	// Create a source: 200 with the stored document.
	r = expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/src", "", srcBody("s3cret")), "create the source")
	doc := r.json(t)
	v1, _ := doc["version"].(float64)
	if v1 <= 0 || doc["name"] != "src" || doc["kind"] != "source" || getPath(doc, "connection.passwordSet") != true ||
		getPath(doc, "source.slot") != "queen_src" || getPath(doc, "source.snapshotChunkRows") != 2000.0 || getPath(doc, "connection.port") != 5432.0 {
		t.Fatalf("stored document: %s", r.body)
	}
	if strings.Contains(string(r.body), "s3cret") || strings.Contains(string(r.body), "sealedPassword") {
		t.Fatalf("a read shows the password: %s", r.body)
	}
	if _, ok := doc["state"].(map[string]any); !ok || getPath(doc, "status.phase") == nil {
		t.Fatalf("a source's read has status and state: %s", r.body)
	}

	// A conditional PUT with a stale version loses; with the current one wins.
	stale := srcBody(nil)
	stale["version"] = v1 + 1
	r = call(t, s, "PUT", "/api/v1/connectors/src", "", stale)
	expectError(t, 409, "conflict", r, "stale version")
	stale["version"] = v1
	r = expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/src", "", stale), "current version")
	v2 := r.json(t)["version"].(float64)
	if v2 <= v1 || getPath(r.json(t), "connection.passwordSet") != true {
		t.Fatalf("after a conditional write: %s", r.body)
	}
	stale["version"] = v1
	expectError(t, 409, "conflict", call(t, s, "PUT", "/api/v1/connectors/src", "", stale), "the first version again")
	create0 := sinkBody(nil)
	create0["version"] = 0
	expectError(t, 409, "conflict", call(t, s, "PUT", "/api/v1/connectors/src", "", map[string]any{
		"kind": "source", "version": 0, "connection": srcBody(nil)["connection"], "source": srcBody(nil)["source"]}), "version 0 on an existing connector")
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", create0), "version 0 creates")

	// The kind cannot change.
	expectError(t, 409, "kind_change", call(t, s, "PUT", "/api/v1/connectors/src", "", sinkBody(nil)), "source to sink")
	expectError(t, 409, "kind_change", call(t, s, "PUT", "/api/v1/connectors/snk", "", srcBody(nil)), "sink to source")

	// The list holds both, each with its status; only the source has state.
	r = expect(t, 200, call(t, s, "GET", "/api/v1/connectors", "", nil), "list")
	var list struct {
		Connectors []map[string]any `json:"connectors"`
	}
	json.Unmarshal(r.body, &list)
	if len(list.Connectors) != 2 || list.Connectors[0]["name"] != "snk" || list.Connectors[1]["name"] != "src" {
		t.Fatalf("list: %s", r.body)
	}
	if _, has := list.Connectors[0]["state"]; has {
		t.Fatalf("a sink has no state: %s", r.body)
	}

	// Resync: 202 on a source, 400 not_a_source on a sink.
	r = expect(t, 202, call(t, s, "POST", "/api/v1/connectors/src/resync", "", nil), "resync the source")
	if r.json(t)["resync"] != 1.0 {
		t.Fatalf("resync count: %s", r.body)
	}
	expectError(t, 400, "not_a_source", call(t, s, "POST", "/api/v1/connectors/snk/resync", "", nil), "resync a sink")

	// Deleting a sink is 200 at once.
	r = expect(t, 200, call(t, s, "DELETE", "/api/v1/connectors/snk", "", nil), "delete the sink")
	if r.json(t)["deleted"] != true {
		t.Fatalf("delete sink: %s", r.body)
	}
	expectError(t, 404, "connector_not_found", call(t, s, "GET", "/api/v1/connectors/snk", "", nil), "the sink is gone")
	expectError(t, 400, "invalid_parameter", call(t, s, "DELETE", "/api/v1/connectors/src?dropSlot=maybe", "", nil), "dropSlot=maybe")

	// ?dropSlot=false removes a source at once.
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/src2", "", srcBody(nil)), "create src2")
	r = expect(t, 200, call(t, s, "DELETE", "/api/v1/connectors/src2?dropSlot=false", "", nil), "delete src2 keeping the slot")
	expectError(t, 404, "connector_not_found", call(t, s, "GET", "/api/v1/connectors/src2", "", nil), "src2 is gone")
}

// A source's DELETE is 202 and marks it deleting; its owner (here the test
// runner, as the real source does after dropping its slot) calls
// Env.Remove and the document is gone.
func TestConnectorDeleteSource(t *testing.T) {
	e := connTestServer(t, connOpts{key: testKey})
	s := e.srv
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/src", "", srcBody("pw")), "create")
	waitFor(t, "the source runs", func() error {
		if _, ok := e.runs.live("default/src"); !ok {
			return fmt.Errorf("not running; started %d", e.runs.startedCount())
		}
		return nil
	})
	r := expect(t, 202, call(t, s, "DELETE", "/api/v1/connectors/src", "", nil), "delete the source")
	if m := r.json(t); m["deleting"] != true || m["deleted"] != false {
		t.Fatalf("delete source: %s", r.body)
	}
	// While its owner has not removed it, a PUT is refused and a second
	// DELETE answers 202 again.
	waitFor(t, "the document is removed by the deleting runner", func() error {
		r := call(t, s, "GET", "/api/v1/connectors/src", "", nil)
		if r.status == 404 {
			return nil
		}
		return fmt.Errorf("still there: %d %s", r.status, r.body)
	})
	e.runs.mu.Lock()
	sawDeleting := false
	for _, run := range e.runs.started {
		sawDeleting = sawDeleting || run.Deleting
	}
	e.runs.mu.Unlock()
	if !sawDeleting {
		t.Fatal("no runner saw the document marked deleting")
	}
}

func TestConnectorDeletingRefusesWrites(t *testing.T) {
	// Without a source factory nobody removes a deleting source.
	e := connTestServer(t, connOpts{key: testKey, disabled: true})
	s := e.srv
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/src", "", srcBody(nil)), "create")
	expect(t, 202, call(t, s, "DELETE", "/api/v1/connectors/src", "", nil), "delete")
	r := expect(t, 200, call(t, s, "GET", "/api/v1/connectors/src", "", nil), "read a deleting source")
	if r.json(t)["deleting"] != true {
		t.Fatalf("not marked deleting: %s", r.body)
	}
	expect(t, 202, call(t, s, "DELETE", "/api/v1/connectors/src", "", nil), "delete again")
	expectError(t, 409, "conflict", call(t, s, "PUT", "/api/v1/connectors/src", "", srcBody(nil)), "put while deleting")
	expectError(t, 409, "conflict", call(t, s, "POST", "/api/v1/connectors/src/resync", "", nil), "resync while deleting")
	expect(t, 200, call(t, s, "DELETE", "/api/v1/connectors/src?dropSlot=false", "", nil), "remove at once")
	expectError(t, 404, "connector_not_found", call(t, s, "GET", "/api/v1/connectors/src", "", nil), "gone")
}

func TestConnectorPasswordSealed(t *testing.T) {
	e := connTestServer(t, connOpts{key: testKey})
	s := e.srv
	const pw = "correct horse battery staple"
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", sinkBody(pw)), "create")

	// Stored sealed: the replicated value never holds the password.
	ctx := context.Background()
	kv, ok, err := e.b.KVGet(ctx, connector.SystemTenant, connector.DocKey("default", "snk"))
	if err != nil || !ok {
		t.Fatalf("stored document: %v %v", ok, err)
	}
	if strings.Contains(string(kv.Value), pw) || !strings.Contains(string(kv.Value), "sealedPassword") {
		t.Fatalf("stored value: %s", kv.Value)
	}
	// And a client cannot reach it through the KV API.
	expectError(t, 404, "key_not_found", call(t, s, "GET", "/api/v1/kv/"+connector.DocKey("default", "snk"), "", nil), "the document through the KV API")

	// The runner gets it unsealed.
	waitFor(t, "the runner gets the password", func() error {
		if r, ok := e.runs.live("default/snk"); !ok || r.Password != pw {
			return fmt.Errorf("live %v %+v", ok, r)
		}
		return nil
	})
	r := expect(t, 200, call(t, s, "GET", "/api/v1/connectors/snk", "", nil), "read")
	if strings.Contains(string(r.body), pw) || getPath(r.json(t), "connection.passwordSet") != true {
		t.Fatalf("read: %s", r.body)
	}
	// Omitted keeps it.
	changed := sinkBody(nil)
	changed["sink"].(map[string]any)["batch"] = 100
	r = expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", changed), "change without a password")
	v := uint64(r.json(t)["version"].(float64))
	if getPath(r.json(t), "connection.passwordSet") != true {
		t.Fatalf("an omitted password was not kept: %s", r.body)
	}
	waitFor(t, "the restarted runner still has the password", func() error {
		if r, ok := e.runs.live("default/snk"); !ok || r.Version != v || r.Password != pw {
			return fmt.Errorf("live %v %+v, want version %d", ok, r, v)
		}
		return nil
	})
	// "" removes it.
	r = expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", sinkBody("")), "remove the password")
	v = uint64(r.json(t)["version"].(float64))
	if getPath(r.json(t), "connection.passwordSet") != false {
		t.Fatalf("\"\" did not remove the password: %s", r.body)
	}
	kv, _, _ = e.b.KVGet(ctx, connector.SystemTenant, connector.DocKey("default", "snk"))
	if strings.Contains(string(kv.Value), "sealedPassword") {
		t.Fatalf("a removed password is still stored: %s", kv.Value)
	}
	waitFor(t, "the runner has no password", func() error {
		if r, ok := e.runs.live("default/snk"); !ok || r.Version != v || r.Password != "" {
			return fmt.Errorf("live %v %+v", ok, r)
		}
		return nil
	})
}

func TestConnectorEncryptionRequired(t *testing.T) {
	e := connTestServer(t, connOpts{})
	s := e.srv
	r := call(t, s, "PUT", "/api/v1/connectors/snk", "", sinkBody("pw"))
	expectError(t, 400, "encryption_required", r, "a password without a key")
	expectError(t, 404, "connector_not_found", call(t, s, "GET", "/api/v1/connectors/snk", "", nil), "nothing stored")
	// Without a password there is nothing to seal.
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", sinkBody(nil)), "no password, no key")
}

// A node with another key (here: the same data, reopened with a new key)
// cannot open the password and says so in the status.
func TestConnectorUnsealOnAnotherKey(t *testing.T) {
	dir := t.TempDir()
	e := connTestServer(t, connOpts{key: testKey, dataDir: dir, disabled: true})
	expect(t, 200, call(t, e.srv, "PUT", "/api/v1/connectors/snk", "", sinkBody("pw")), "create")
	e.srv.Close()
	e.rt.Stop()
	if err := e.b.Close(); err != nil {
		t.Fatal(err)
	}
	other := strings.Repeat("ab", 32)
	e2 := connTestServer(t, connOpts{key: other, dataDir: dir})
	waitFor(t, "status unseal", func() error {
		r := call(t, e2.srv, "GET", "/api/v1/connectors/snk", "", nil)
		st, _ := r.json(t)["status"].(map[string]any)
		if st["phase"] != "error" || st["code"] != "unseal" || !strings.Contains(fmt.Sprint(st["message"]), "QUEEN_ENCRYPTION_KEY") {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})
	if n := e2.runs.startedCount(); n != 0 {
		t.Fatalf("a connector whose password cannot be opened ran %d times", n)
	}
}

func TestConnectorTenantIsolation(t *testing.T) {
	a := authzTokens(t, auth.Config{})
	e := connTestServer(t, connOpts{key: testKey, auth: a})
	s := e.srv
	ra := expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/orders", tokAlphaAdmin, srcBody("a")), "alpha creates orders")
	rb := expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/orders", tokBetaAdmin, srcBody("b")), "beta creates orders")
	sa, sb := getPath(ra.json(t), "source.slot"), getPath(rb.json(t), "source.slot")
	pa, pb := getPath(ra.json(t), "source.publication"), getPath(rb.json(t), "source.publication")
	if sa == sb || pa == pb || sa == "queen_orders" {
		t.Fatalf("derived names: alpha %v/%v, beta %v/%v", sa, pa, sb, pb)
	}
	// A write needs admin; a read needs read.
	expectError(t, 403, "forbidden", call(t, s, "PUT", "/api/v1/connectors/orders", tokAlphaWrite, srcBody(nil)), "write token")
	expectError(t, 403, "forbidden", call(t, s, "DELETE", "/api/v1/connectors/orders", tokAlphaRead, nil), "read token deletes")
	expect(t, 200, call(t, s, "GET", "/api/v1/connectors/orders", tokAlphaRead, nil), "read token reads")

	// Each tenant sees its own only.
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/alpha-only", tokAlphaAdmin, sinkBody(nil)), "alpha's sink")
	expectError(t, 404, "connector_not_found", call(t, s, "GET", "/api/v1/connectors/alpha-only", tokBetaAdmin, nil), "beta reads alpha's sink")
	expectError(t, 404, "connector_not_found", call(t, s, "DELETE", "/api/v1/connectors/alpha-only", tokBetaAdmin, nil), "beta deletes alpha's sink")
	r := expect(t, 200, call(t, s, "GET", "/api/v1/connectors", tokBetaAdmin, nil), "beta lists")
	var list struct {
		Connectors []map[string]any `json:"connectors"`
	}
	json.Unmarshal(r.body, &list)
	if len(list.Connectors) != 1 || getPath(list.Connectors[0], "source.slot") != sb {
		t.Fatalf("beta's list: %s", r.body)
	}
	// The runtime runs both tenants' connectors, each in its tenant.
	waitFor(t, "both tenants' sources run", func() error {
		ra, oka := e.runs.live("alpha/orders")
		rb, okb := e.runs.live("beta/orders")
		if !oka || !okb || ra.Password != "a" || rb.Password != "b" {
			return fmt.Errorf("alpha %v %+v, beta %v %+v", oka, ra, okb, rb)
		}
		return nil
	})
	// Each tenant's token scrapes its own connectors' series only.
	r = expect(t, 200, call(t, s, "GET", "/metrics/prometheus", tokBetaAdmin, nil), "beta scrapes")
	if !strings.Contains(string(r.body), `queen_pg_connector_owner{connector="orders",tenant="beta"} 1`) || strings.Contains(string(r.body), `tenant="alpha"`) {
		t.Fatalf("beta's scrape:\n%s", r.body)
	}
	// Deleting beta's leaves alpha's.
	expect(t, 200, call(t, s, "DELETE", "/api/v1/connectors/orders?dropSlot=false", tokBetaAdmin, nil), "beta deletes its own")
	expect(t, 200, call(t, s, "GET", "/api/v1/connectors/orders", tokAlphaAdmin, nil), "alpha's is still there")
	waitFor(t, "beta's stops, alpha's runs", func() error {
		_, oka := e.runs.live("alpha/orders")
		_, okb := e.runs.live("beta/orders")
		if !oka || okb {
			return fmt.Errorf("alpha running %v, beta running %v", oka, okb)
		}
		return nil
	})
	// The pg block of /status is the tenant's own.
	r = expect(t, 200, call(t, s, "GET", "/status", tokBetaAdmin, nil), "beta's status")
	if n := len(getPath(r.json(t), "pg").(map[string]any)["connectors"].([]any)); n != 0 {
		t.Fatalf("beta's pg block: %s", r.body)
	}
}

func TestConnectorRuntime(t *testing.T) {
	e := connTestServer(t, connOpts{key: testKey})
	s := e.srv
	r := expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", sinkBody(nil)), "create")
	v1 := uint64(r.json(t)["version"].(float64))
	waitFor(t, "the sink runs version 1", func() error {
		if r, ok := e.runs.live("default/snk"); !ok || r.Version != v1 {
			return fmt.Errorf("live %v %+v", ok, r)
		}
		return nil
	})
	// Its status shows in GET and in /status.
	waitFor(t, "status running", func() error {
		r := call(t, s, "GET", "/api/v1/connectors/snk", "", nil)
		if p := getPath(r.json(t), "status.phase"); p != "running" {
			return fmt.Errorf("phase %v", p)
		}
		return nil
	})
	r = expect(t, 200, call(t, s, "GET", "/status", "", nil), "/status")
	pg := r.json(t)["pg"].(map[string]any)
	conns := pg["connectors"].([]any)
	if pg["enabled"] != true || len(conns) != 1 || conns[0].(map[string]any)["name"] != "snk" || conns[0].(map[string]any)["phase"] != "running" {
		t.Fatalf("pg block: %s", r.body)
	}
	// Metrics, labelled connector and tenant.
	r = expect(t, 200, call(t, s, "GET", "/metrics/prometheus", "", nil), "metrics")
	for _, want := range []string{
		`queen_pg_sink_applied_total{connector="snk",tenant="default"} 3`,
		`queen_pg_connector_owner{connector="snk",tenant="default"} 1`,
		`queen_pg_sink_batches_total{connector="snk",tenant="default"} 0`,
		`queen_pg_source_transactions_total{connector="snk",tenant="default"} 0`,
		`queen_pg_source_messages_total{`, `queen_pg_source_bundles_total{`, `queen_pg_source_snapshot_rows_total{`,
		`queen_pg_source_slot_lag_bytes{`, `queen_pg_source_pointer_lsn{`, `queen_pg_sink_skipped_total{`,
		`queen_pg_sink_dlq_total{`, `queen_pg_connector_errors_total{connector="snk",tenant="default"} 0`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// A changed document restarts the runner with the new version.
	changed := sinkBody(nil)
	changed["sink"].(map[string]any)["workers"] = 4
	r = expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", changed), "change")
	v2 := uint64(r.json(t)["version"].(float64))
	waitFor(t, "the sink runs version 2", func() error {
		if r, ok := e.runs.live("default/snk"); !ok || r.Version != v2 {
			return fmt.Errorf("live %v %+v", ok, r)
		}
		return nil
	})
	e.runs.mu.Lock()
	stoppedV1 := false
	for _, r := range e.runs.stopped {
		stoppedV1 = stoppedV1 || r.Version == v1
	}
	e.runs.mu.Unlock()
	if !stoppedV1 {
		t.Fatal("version 1 was not stopped before version 2 ran")
	}

	// A failing connector shows its code and sentence, counts an error,
	// and is retried.
	e.runs.mu.Lock()
	e.runs.fail["bad"] = connector.Errorf("table_missing", nil, "table public.orders_copy does not exist; create it")
	e.runs.mu.Unlock()
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/bad", "", sinkBody(nil)), "create a failing sink")
	waitFor(t, "status error table_missing", func() error {
		r := call(t, s, "GET", "/api/v1/connectors/bad", "", nil)
		st := r.json(t)["status"].(map[string]any)
		if st["phase"] != "error" || st["code"] != "table_missing" || !strings.Contains(fmt.Sprint(st["message"]), "create it") {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})
	r = expect(t, 200, call(t, s, "GET", "/status", "", nil), "/status")
	found := false
	for _, c := range r.json(t)["pg"].(map[string]any)["connectors"].([]any) {
		c := c.(map[string]any)
		found = found || (c["name"] == "bad" && c["phase"] == "error" && c["code"] == "table_missing")
	}
	if !found {
		t.Fatalf("the failing sink in /status: %s", r.body)
	}
	waitFor(t, "errors counted and retried", func() error {
		r := call(t, s, "GET", "/metrics/prometheus", "", nil)
		if !strings.Contains(string(r.body), `queen_pg_connector_errors_total{connector="bad",tenant="default"} 2`) {
			return fmt.Errorf("no second error counted yet")
		}
		return nil
	})

	// A connector that panics is an error of its own, never a crash.
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/panics", "", sinkBody(nil)), "create a panicking sink")
	waitFor(t, "status error internal", func() error {
		r := call(t, s, "GET", "/api/v1/connectors/panics", "", nil)
		st := r.json(t)["status"].(map[string]any)
		if st["phase"] != "error" || st["code"] != "internal" || !strings.Contains(fmt.Sprint(st["message"]), "a bug in a connector") {
			return fmt.Errorf("status %v", st)
		}
		return nil
	})
	if _, ok := e.runs.live("default/snk"); !ok {
		t.Fatal("another connector's panic stopped the sink")
	}

	// Delete stops it and drops its series.
	expect(t, 200, call(t, s, "DELETE", "/api/v1/connectors/snk", "", nil), "delete")
	waitFor(t, "the sink stops", func() error {
		if _, ok := e.runs.live("default/snk"); ok {
			return fmt.Errorf("still running")
		}
		return nil
	})
	waitFor(t, "its series are gone", func() error {
		r := call(t, s, "GET", "/metrics/prometheus", "", nil)
		if strings.Contains(string(r.body), `connector="snk"`) {
			return fmt.Errorf("series of a deleted connector remain")
		}
		return nil
	})
}

func TestConnectorDisabled(t *testing.T) {
	e := connTestServer(t, connOpts{key: testKey, disabled: true})
	s := e.srv
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", sinkBody(nil)), "create")
	r := expect(t, 200, call(t, s, "GET", "/api/v1/connectors/snk", "", nil), "read")
	if p := getPath(r.json(t), "status.phase"); p != "disabled" {
		t.Fatalf("phase %v, want disabled", p)
	}
	r = expect(t, 200, call(t, s, "GET", "/status", "", nil), "/status")
	pg := r.json(t)["pg"].(map[string]any)
	if pg["enabled"] != false || pg["connectors"].([]any)[0].(map[string]any)["phase"] != "disabled" {
		t.Fatalf("pg block: %s", r.body)
	}
	time.Sleep(300 * time.Millisecond) // three reload periods: nothing may start
	if n := e.runs.startedCount(); n != 0 {
		t.Fatalf("a disabled node ran %d connectors", n)
	}
}

// Two writers with the same version: exactly one wins, the other gets 409.
func TestConnectorConcurrentConditionalPut(t *testing.T) {
	e := connTestServer(t, connOpts{key: testKey, disabled: true})
	s := e.srv
	r := expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/snk", "", sinkBody(nil)), "create")
	v := r.json(t)["version"].(float64)
	const n = 8
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := sinkBody(nil)
			body["version"] = v
			body["sink"].(map[string]any)["batch"] = 10 + i
			codes[i] = call(t, s, "PUT", "/api/v1/connectors/snk", "", body).status
		}()
	}
	wg.Wait()
	wins := 0
	for _, c := range codes {
		switch c {
		case 200:
			wins++
		case 409:
		default:
			t.Fatalf("status %d", c)
		}
	}
	if wins != 1 {
		t.Fatalf("%d conditional writes of one version won, want 1 (%v)", wins, codes)
	}
}

// A running source's lease shows in its state; stopping the node (as on
// SIGTERM) gives it back at once instead of after the TTL.
func TestConnectorStopReleasesLease(t *testing.T) {
	e := connTestServer(t, connOpts{key: testKey})
	s := e.srv
	expect(t, 200, call(t, s, "PUT", "/api/v1/connectors/src", "", srcBody(nil)), "create")
	waitFor(t, "the lease shows in the state", func() error {
		r := call(t, s, "GET", "/api/v1/connectors/src", "", nil)
		m := r.json(t)
		if getPath(m, "state.lease.node") != e.b.Health().Node || getPath(m, "state.lease.expiresAt") == nil || getPath(m, "status.phase") != "streaming" {
			return fmt.Errorf("read: %s", r.body)
		}
		return nil
	})
	ctx := context.Background()
	if _, ok, err := e.b.KVGet(ctx, "default", connector.LeaseKey("src")); err != nil || !ok {
		t.Fatalf("lease key: %v %v", ok, err)
	}
	start := time.Now()
	e.rt.Stop()
	if _, ok, err := e.b.KVGet(ctx, "default", connector.LeaseKey("src")); err != nil || ok {
		t.Fatalf("after Stop the lease is still held (%v, %v)", ok, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Stop took %v", d)
	}
	if _, ok := e.runs.live("default/src"); ok {
		t.Fatal("the source still runs after Stop")
	}
}
