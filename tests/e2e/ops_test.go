package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

type healthReply struct {
	Status  string `json:"status"`
	Node    string `json:"node"`
	Role    string `json:"role"`
	Version string `json:"version"`
}

func TestHealthAndStatus(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	s.pushN(t, "ops-a", "p", 2)
	s.pushN(t, "ops-b", "p", 1)

	var h healthReply
	s.callJSON(t, "GET", "/health", nil, 200, &h)
	if h.Status != "healthy" || h.Node == "" || h.Role != "leader" || h.Version == "" {
		t.Errorf("/health: %+v; want status healthy, a node, role leader (single node), a version", h)
	}
	for _, path := range []string{"/status", "/api/v1/status"} {
		var st map[string]json.RawMessage
		r := s.callJSON(t, "GET", path, nil, 200, &st)
		for _, k := range []string{"node", "role", "cluster", "queues", "pg"} {
			if _, ok := st[k]; !ok {
				t.Errorf("%s lacks %q:\n%s", path, k, r)
			}
		}
		var node, role string
		json.Unmarshal(st["node"], &node)
		json.Unmarshal(st["role"], &role)
		if node != h.Node || role != "leader" {
			t.Errorf("%s: node %q role %q; /health says %q leader", path, node, role, h.Node)
		}
		var cl struct {
			Leader  string            `json:"leader"`
			Members []json.RawMessage `json:"members"`
		}
		if err := json.Unmarshal(st["cluster"], &cl); err != nil || cl.Leader == "" || len(cl.Members) != 1 {
			t.Errorf("%s cluster: want the leader and one member:\n%s", path, r)
		}
		if !strings.Contains(string(st["cluster"]), h.Node) {
			t.Errorf("%s cluster does not name this node %s:\n%s", path, h.Node, st["cluster"])
		}
		if len(st["queues"]) == 0 || string(st["queues"]) == "null" {
			t.Errorf("%s: queues summary is empty:\n%s", path, r)
		}
	}
}

// TestMetricsPrometheus: docs/http-api.md "Operations" lists GET /metrics/prometheus
// (Prometheus text format).
func TestMetricsPrometheus(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	s.pushN(t, "metrics-q", "p", 1)
	r := s.call(t, "GET", "/metrics/prometheus", nil)
	if r.Status != 200 {
		t.Fatalf("want 200 with Prometheus text:\n%s", r)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("content-type %q, want text/plain (Prometheus text format)", ct)
	}
	if !strings.Contains(string(r.Body), "# TYPE ") {
		t.Errorf("no \"# TYPE\" line in:\n%s", clip(r.Body))
	}
	// The storage engine's block cache is reported, so that an operator can
	// see whether reads are served from memory (docs/operations.md).
	for _, want := range []string{"# TYPE queen_storage_block_cache_bytes gauge", "# TYPE queen_storage_block_cache_hits_total counter",
		"# TYPE queen_storage_block_cache_misses_total counter"} {
		if !strings.Contains(string(r.Body), want) {
			t.Errorf("no %q line in:\n%s", want, clip(r.Body))
		}
	}
	// The push above is kept to answer a retry of it: the index of applied
	// requests reports it, with the memory it is counted at.
	for _, name := range []string{"queen_retry_index_requests", "queen_retry_index_bytes"} {
		v, ok := metricValue(string(r.Body), name)
		if !ok || v < 1 {
			t.Errorf("%s = %v (found %v), want at least 1, in:\n%s", name, v, ok, clip(r.Body))
		}
	}
	if v, ok := metricValue(string(r.Body), "queen_retry_index_window_seconds"); !ok || v < 0 {
		t.Errorf("queen_retry_index_window_seconds = %v (found %v), want a non-negative age", v, ok)
	}
}

// metricValue returns the value of an unlabelled series in Prometheus text.
func metricValue(body, name string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// TestMetricsTokens: with auth on, a scrape without a token names no tenant,
// a tenant's read token sees its own tenant, and QUEEN_METRICS_TOKEN (read
// from the environment by the binary) sees every tenant.
func TestMetricsTokens(t *testing.T) {
	t.Parallel()
	hash := func(tok string) string { sum := sha256.Sum256([]byte(tok)); return hex.EncodeToString(sum[:]) }
	tokens := filepath.Join(t.TempDir(), "tokens")
	body := hash("acme-writer-token") + " acme write\n" + hash("acme-reader-token") + " acme read\n" + hash("globex-writer-token") + " globex write\n"
	if err := os.WriteFile(tokens, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	const metricsToken = "e2e-metrics-token-5f0c9a1b"
	s := startServer(t, withEnv("QUEEN_TOKENS_FILE", tokens), withEnv("QUEEN_METRICS_TOKEN", metricsToken))
	get := func(method, path, tok string, payload string) (int, string) {
		t.Helper()
		var rd io.Reader
		if payload != "" {
			rd = strings.NewReader(payload)
		}
		req, err := http.NewRequest(method, s.base+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := s.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	for tok, q := range map[string]string{"acme-writer-token": "acme-orders", "globex-writer-token": "globex-orders"} {
		if code, b := get("POST", "/api/v1/push", tok, `{"items":[{"queue":"`+q+`","payload":1}]}`); code != 201 {
			t.Fatalf("push as %s: %d %s", tok, code, b)
		}
	}
	for _, c := range []struct {
		tok        string
		see, hides []string
	}{
		{"", nil, []string{"acme", "globex"}},
		{"acme-reader-token", []string{`queue="acme-orders"`}, []string{"globex"}},
		{metricsToken, []string{`queue="acme-orders"`, `queue="globex-orders"`}, nil},
	} {
		code, b := get("GET", "/metrics/prometheus", c.tok, "")
		if code != 200 || !strings.Contains(b, "queen_raft_leader 1") {
			t.Fatalf("scrape with %q: %d, want 200 with queen_raft_leader 1:\n%s", c.tok, code, clip([]byte(b)))
		}
		for _, w := range c.see {
			if !strings.Contains(b, w) {
				t.Errorf("scrape with %q lacks %s", c.tok, w)
			}
		}
		for _, w := range c.hides {
			if strings.Contains(b, w) {
				t.Errorf("scrape with %q shows %q", c.tok, w)
			}
		}
	}
	if code, b := get("GET", "/metrics/prometheus", "wrong-token", ""); code != 401 {
		t.Errorf("scrape with an unknown token: %d %s, want 401", code, b)
	}
}

// TestHealthMeansReady watches a server start and restart: a /health 200
// must mean the node can serve, so a single-voter node answering 200 must say
// role "leader" and a push right after it succeeds. Several pollers watch at
// once, since the window to catch is a few milliseconds wide.
func TestHealthMeansReady(t *testing.T) {
	t.Parallel()
	s := startServer(t, noReadyWait())
	watch := func(round string) {
		var (
			mu    sync.Mutex
			first *reply
			bad   []string
		)
		done := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				deadline := time.Now().Add(20 * time.Second)
				for time.Now().Before(deadline) {
					select {
					case <-done:
						return
					default:
					}
					r, err := s.roundTrip("GET", "/health", nil)
					if err != nil {
						time.Sleep(time.Millisecond)
						continue
					}
					var h healthReply
					json.Unmarshal(r.Body, &h)
					mu.Lock()
					switch {
					case r.Status == 200 && h.Role != "leader":
						bad = append(bad, r.String())
					case r.Status == 200:
						if first == nil {
							first = r
						}
					case r.Status != 503:
						bad = append(bad, "before ready, want 503: "+r.String())
					}
					mu.Unlock()
					if r.Status == 200 && h.Role == "leader" {
						return
					}
				}
			}()
		}
		// Push as soon as any poller has seen a 200.
		var push *reply
		err := checkFor(20*time.Second, time.Millisecond, func() error {
			mu.Lock()
			seen := first != nil || len(bad) > 0
			mu.Unlock()
			if !seen {
				return fmt.Errorf("no /health 200 yet")
			}
			var err error
			push, err = s.roundTrip("POST", "/api/v1/push", M{"items": []pushItem{{Queue: "ready-q", Payload: round}}})
			return err
		})
		close(done)
		wg.Wait()
		if err != nil {
			t.Fatalf("%s: server never healthy: %v", round, err)
		}
		if len(bad) > 0 {
			t.Errorf("%s: /health answered 200 for a single-voter node that is not (yet) the serving leader (%d times); first:\n%s", round, len(bad), bad[0])
		}
		if push.Status != http.StatusCreated {
			t.Errorf("%s: the push right after the first /health 200 failed:\n%s", round, push)
		}
	}
	watch("start")
	if err := s.Stop(); err != nil {
		t.Errorf("SIGTERM: %v", err)
	}
	s.Restart(t)
	watch("restart")
}

// TestReadsAfterStart: a fresh node that has taken no write yet answers
// reads (they must not wait for a write to come along).
func TestReadsAfterStart(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	for _, path := range []string{"/api/v1/resources/queues", "/api/v1/consumer-groups", "/api/v1/dlq", "/api/v1/status"} {
		s.promptGet(t, path, 3*time.Second)
	}
	if t.Failed() {
		// Show that a write unblocks them (for the bug report).
		s.pushN(t, "unblock", "p", 1)
		s.promptGet(t, "/api/v1/resources/queues", 3*time.Second)
		t.Logf("after one push, GET /api/v1/resources/queues answers")
	}
}

// TestRestart stops the server with SIGTERM and then kills it with SIGKILL;
// each time, what was acknowledged before survives.
func TestRestart(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	const q, q2 = "rs", "rs2"
	pushed := s.pushN(t, q, "p", 10)
	s.pushN(t, q2, "p", 3)
	s.configure(t, M{"queue": q, "options": M{"retryLimit": 7}})
	// Group g consumes 0-3; queue mode consumes 0-2; g2 dead-letters 0.
	s.ackAll(t, s.mustPop(t, q, "consumerGroup=g&subscriptionMode=all&batch=4", 4), "completed")
	s.ackAll(t, s.mustPop(t, q, "batch=3", 3), "completed")
	s.mustAck(t, ackFor(s.mustPop(t, q, "consumerGroup=g2&subscriptionMode=all", 1).Messages[0], "dlq"))
	// A group that has consumed nothing yet (mode new: starts at the end).
	s.mustEmpty(t, q, "consumerGroup=g-new")
	before := s.queues(t)

	if err := s.Stop(); err != nil {
		t.Errorf("SIGTERM: the server did not exit cleanly: %v", err)
	}
	s.Restart(t)

	// Reads answer right after the restart, before any write (see
	// TestReadsAfterStart); checked without failing so that the rest runs.
	s.promptGet(t, "/api/v1/resources/queues", 3*time.Second)
	g := s.mustPop(t, q, "consumerGroup=g&batch=100", 6)
	after := s.queues(t)
	for _, name := range []string{q, q2} {
		if before[name].Messages != after[name].Messages || before[name].Partitions != after[name].Partitions {
			t.Errorf("queue %s: before restart %+v, after %+v", name, before[name], after[name])
		}
	}
	if opts := s.configure(t, M{"queue": q}); opts["retryLimit"] != float64(7) {
		t.Errorf("retryLimit after restart: %v, want 7", opts["retryLimit"])
	}
	if got := dataInts(t, g.Messages); !intsEqual(got, seq(4, 10)) {
		t.Errorf("group g after restart: got %v, want 4..9 (0-3 were acknowledged)", got)
	}
	qm := s.mustPop(t, q, "batch=100", 7)
	if got := dataInts(t, qm.Messages); !intsEqual(got, seq(3, 10)) {
		t.Errorf("queue mode after restart: got %v, want 3..9", got)
	}
	if d := s.dlq(t, "queue="+q+"&consumerGroup=g2"); d.Total != 1 || d.Messages[0].ID != pushed[0].MessageID {
		t.Errorf("dlq after restart: %+v", d)
	}
	if m := s.mustPop(t, q, "consumerGroup=g2", 1).Messages[0]; m.ID != pushed[1].MessageID {
		t.Errorf("g2 after restart: got %s, want message 1", m.ID)
	}
	s.mustEmpty(t, q, "consumerGroup=g-new")
	s.ackAll(t, g, "completed")
	s.ackAll(t, qm, "completed")

	// Pushes continue at the next offset of the same partition.
	more := s.pushN(t, q, "p", 5)
	for i, r := range more {
		if r.PartitionID != pushed[0].PartitionID || r.Offset != pushed[9].Offset+1+int64(i) {
			t.Errorf("push after restart: %+v; want partition %s offset %d", r, pushed[0].PartitionID, pushed[9].Offset+1+int64(i))
		}
	}

	// Crash: everything acknowledged before SIGKILL survives.
	s.Kill()
	s.Restart(t)
	s.promptGet(t, "/api/v1/resources/queues/"+q, 3*time.Second)
	for _, query := range []string{"consumerGroup=g&batch=100", "batch=100", "consumerGroup=g-new&batch=100"} {
		p := s.mustPop(t, q, query, 5)
		if got := dataInts(t, p.Messages); !intsEqual(got, seq(0, 5)) {
			t.Errorf("pop %s after kill -9: got %v, want only the 5 pushed last (0..4)", query, got)
		}
		for i, m := range p.Messages {
			if m.ID != more[i].MessageID {
				t.Errorf("pop %s after kill -9: message %d is %s, want %s", query, i, m.ID, more[i].MessageID)
			}
		}
	}
	if n := s.queueTotal(t, q); n != 15 {
		t.Errorf("total after kill -9: %d, want 15", n)
	}
}
