package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fastjson"
)

// fakeQueen is a tiny in-memory server with the shapes of docs/http-api.md's Messages
// section, just enough to check the bench's side of the wire.
type fakeQueen struct {
	mu     sync.Mutex
	cond   *sync.Cond
	queues map[string]*fakeQueue
	nextID int
	// deleted lists the queues deleted, in order.
	deleted []string
	// clientIDs lists the transaction ids pushed by the client, in order.
	clientIDs []string
	// acked counts the acknowledgements that released a message.
	acked int
}

type fakeMsg struct {
	txid string
	data json.RawMessage
}

type fakePart struct {
	name, id string
	msgs     []fakeMsg
}

type fakeGroup struct {
	next   map[string]int    // partition id -> next offset to deliver
	leases map[string]string // partition id -> lease id
	open   map[string]int    // lease id -> unacknowledged messages
}

type fakeQueue struct {
	parts  []*fakePart
	byName map[string]*fakePart
	groups map[string]*fakeGroup
}

func newFakeQueen() *fakeQueen {
	f := &fakeQueen{queues: map[string]*fakeQueue{}}
	f.cond = sync.NewCond(&f.mu)
	return f
}

func (f *fakeQueen) queue(name string) *fakeQueue {
	q := f.queues[name]
	if q == nil {
		q = &fakeQueue{byName: map[string]*fakePart{}, groups: map[string]*fakeGroup{}}
		f.queues[name] = q
	}
	return q
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeQueen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/health":
		writeJSON(w, 200, map[string]string{"status": "healthy", "node": "n1", "role": "leader", "version": "fake"})
	case r.URL.Path == "/api/v1/configure" && r.Method == "POST":
		var req struct {
			Queue string `json:"queue"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, 400, map[string]string{"error": "invalid_json"})
			return
		}
		f.mu.Lock()
		f.queue(req.Queue)
		f.mu.Unlock()
		writeJSON(w, 200, map[string]any{"configured": true, "queue": req.Queue, "options": map[string]any{}})
	case r.URL.Path == "/api/v1/push" && r.Method == "POST":
		f.push(w, r)
	case strings.HasPrefix(r.URL.Path, "/api/v1/pop/queue/") && r.Method == "GET":
		f.pop(w, r, strings.TrimPrefix(r.URL.Path, "/api/v1/pop/queue/"))
	case r.URL.Path == "/api/v1/ack/batch" && r.Method == "POST":
		f.ack(w, r)
	case strings.HasPrefix(r.URL.Path, "/api/v1/resources/queues/") && r.Method == "DELETE":
		name := strings.TrimPrefix(r.URL.Path, "/api/v1/resources/queues/")
		f.mu.Lock()
		_, ok := f.queues[name]
		delete(f.queues, name)
		f.deleted = append(f.deleted, name)
		f.mu.Unlock()
		if !ok {
			writeJSON(w, 404, map[string]string{"error": "queue_not_found"})
			return
		}
		writeJSON(w, 200, map[string]any{"deleted": true, "queue": name})
	default:
		writeJSON(w, 404, map[string]string{"error": "not_found"})
	}
}

func (f *fakeQueen) push(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Items []struct {
			Queue     string          `json:"queue"`
			Partition *string         `json:"partition"`
			TxID      *string         `json:"transactionId"`
			Payload   json.RawMessage `json:"payload"`
		} `json:"items"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, 400, map[string]string{"error": "invalid_json"})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []map[string]any
	for i, it := range req.Items {
		pn := "Default"
		if it.Partition != nil {
			pn = *it.Partition
		}
		q := f.queue(it.Queue)
		p := q.byName[pn]
		if p == nil {
			f.nextID++
			p = &fakePart{name: pn, id: strconv.Itoa(f.nextID)}
			q.byName[pn] = p
			q.parts = append(q.parts, p)
		}
		f.nextID++
		tx := fmt.Sprintf("tx-%d", f.nextID)
		if it.TxID != nil {
			tx = *it.TxID
			f.clientIDs = append(f.clientIDs, tx)
		}
		p.msgs = append(p.msgs, fakeMsg{txid: tx, data: it.Payload})
		out = append(out, map[string]any{"index": i, "status": "queued", "transaction_id": tx, "message_id": tx,
			"partition_id": p.id, "offset": len(p.msgs) - 1, "queueName": it.Queue})
	}
	f.cond.Broadcast()
	writeJSON(w, 201, out)
}

func (f *fakeQueen) pop(w http.ResponseWriter, r *http.Request, queue string) {
	v := r.URL.Query()
	batch, _ := strconv.Atoi(v.Get("batch"))
	batch = max(batch, 1)
	parts, _ := strconv.Atoi(v.Get("partitions"))
	parts = max(parts, 1)
	group := v.Get("consumerGroup")
	autoAck := v.Get("autoAck") == "true"
	wait := v.Get("wait") == "true"
	timeout := 30 * time.Second
	if t, err := strconv.Atoi(v.Get("timeout")); err == nil {
		timeout = time.Duration(t) * time.Millisecond
	}
	deadline := time.Now().Add(timeout)
	stop := context.AfterFunc(r.Context(), func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	timer := time.AfterFunc(timeout, func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer timer.Stop()

	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	lease := fmt.Sprintf("lease-%d", f.nextID)
	for {
		q := f.queue(queue)
		g := q.groups[group]
		if g == nil {
			g = &fakeGroup{next: map[string]int{}, leases: map[string]string{}, open: map[string]int{}}
			q.groups[group] = g
		}
		var msgs []map[string]any
		claimed := 0
		for _, p := range q.parts {
			if claimed >= parts || len(msgs) >= batch {
				break
			}
			if g.leases[p.id] != "" || g.next[p.id] >= len(p.msgs) {
				continue
			}
			claimed++
			for g.next[p.id] < len(p.msgs) && len(msgs) < batch {
				off := g.next[p.id]
				m := p.msgs[off]
				g.next[p.id]++
				ml := lease
				if autoAck {
					ml = ""
				} else {
					g.leases[p.id] = lease
					g.open[lease]++
				}
				msgs = append(msgs, map[string]any{"id": m.txid, "transactionId": m.txid, "queue": queue,
					"partition": p.name, "partitionId": p.id, "offset": off, "data": m.data, "leaseId": ml,
					"consumerGroup": group, "attempt": 1, "retryCount": 0})
			}
		}
		if len(msgs) > 0 {
			if autoAck {
				lease = ""
			}
			writeJSON(w, 200, map[string]any{"success": true, "queue": queue, "consumerGroup": group,
				"leaseId": lease, "partitionsClaimed": claimed, "messages": msgs})
			return
		}
		if !wait || time.Now().After(deadline) || r.Context().Err() != nil {
			w.WriteHeader(204)
			return
		}
		f.cond.Wait()
	}
}

func (f *fakeQueen) ack(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ConsumerGroup string `json:"consumerGroup"`
		Acks          []struct {
			TransactionID string `json:"transactionId"`
			PartitionID   string `json:"partitionId"`
			LeaseID       string `json:"leaseId"`
			Status        string `json:"status"`
		} `json:"acknowledgments"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, 400, map[string]string{"error": "invalid_json"})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []map[string]any
	for i, a := range req.Acks {
		ok := false
		released := false
		for _, q := range f.queues {
			g := q.groups[req.ConsumerGroup]
			if g == nil || g.leases[a.PartitionID] != a.LeaseID || a.Status != "completed" {
				continue
			}
			ok = true
			f.acked++
			g.open[a.LeaseID]--
			if g.open[a.LeaseID] == 0 {
				delete(g.open, a.LeaseID)
				delete(g.leases, a.PartitionID)
				released = true
			}
		}
		var e any
		if !ok {
			e = "lease_expired"
		}
		out = append(out, map[string]any{"index": i, "transactionId": a.TransactionID, "success": ok,
			"error": e, "leaseReleased": released, "dlq": false})
	}
	f.cond.Broadcast()
	writeJSON(w, 200, out)
}

func testConfig(t *testing.T, url string, extra ...string) *config {
	t.Helper()
	cfg, err := parseFlags(append([]string{"-quick", "-queen-url", url, "-prefill", "2000", "-push-duration", "150ms",
		"-latency-rate", "200", "-latency-duration", "300ms"}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestQueenSideAgainstFake(t *testing.T) {
	f := newFakeQueen()
	srv := httptest.NewServer(f)
	defer srv.Close()
	testQueenSide(t, f, srv.URL)
}

// TestQueenSidePushIDs: with -push-ids every pushed item carries its own
// UUIDv7 transactionId, as a Queen client's does.
func TestQueenSidePushIDs(t *testing.T) {
	f := newFakeQueen()
	srv := httptest.NewServer(f)
	defer srv.Close()
	cfg := testConfig(t, srv.URL)
	cfg.pushIDs = true
	q, err := newQueenSystem(context.Background(), cfg, sysQueen)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	var sc scenario
	for _, s := range cfg.scenarios() {
		if s.kind == kindPush && s.batch == 100 {
			sc = s
			break
		}
	}
	if !sc.ids || !strings.HasSuffix(sc.name, " ids") {
		t.Fatalf("scenario %+v: want ids and a name that says so", sc)
	}
	if r := q.push(context.Background(), sc, newCPUMeter(0)); r.err != nil || r.msgs == 0 {
		t.Fatalf("%s: msgs %d err %v", sc.name, r.msgs, r.err)
	}
	f.mu.Lock()
	ids := slices.Clone(f.clientIDs)
	f.mu.Unlock()
	if len(ids) < 100 {
		t.Fatalf("%d client ids for at least one batch of 100", len(ids))
	}
	uuid7 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for _, id := range ids {
		if !uuid7.MatchString(id) || seen[id] {
			t.Fatalf("id %q: not a UUIDv7, or repeated", id)
		}
		seen[id] = true
	}
}

// TestTxIDs: the ids of -push-ids are UUIDv7s and increase.
func TestTxIDs(t *testing.T) {
	prev := ""
	for i := 0; i < 20000; i++ {
		id := newTxID()
		if len(id) != 36 || id[14] != '7' || !strings.ContainsRune("89ab", rune(id[19])) {
			t.Fatalf("id %q is not a UUIDv7", id)
		}
		if id <= prev {
			t.Fatalf("id %d %q does not follow %q", i, id, prev)
		}
		prev = id
	}
}

func TestQueenSideAgainstFakeCluster(t *testing.T) {
	f := newFakeQueen() // two "nodes" that share one state
	a, b := httptest.NewServer(f), httptest.NewServer(f)
	defer a.Close()
	defer b.Close()
	testQueenSide(t, f, a.URL+","+b.URL+"/")
}

func testQueenSide(t *testing.T, f *fakeQueen, urls string, extra ...string) {
	cfg := testConfig(t, urls, extra...)
	ctx := context.Background()
	q, err := newQueenSystem(ctx, cfg, sysQueen)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	if q.version != "fake leader" {
		t.Errorf("version %q", q.version)
	}
	for _, sc := range cfg.scenarios() {
		if sc.kind != kindPush || sc.batch == 10 {
			continue
		}
		r := q.push(ctx, sc, newCPUMeter(0))
		if r.err != nil || r.msgs == 0 || len(r.lat) == 0 {
			t.Fatalf("%s: %+v", sc.name, r.err)
		}
		// Like the stream on the JetStream side, the queue goes with its scenario.
		f.mu.Lock()
		left, deleted := len(f.queues), slices.Clone(f.deleted)
		f.mu.Unlock()
		if left != 0 || len(deleted) == 0 || !strings.Contains(deleted[len(deleted)-1], "push-") {
			t.Fatalf("%s: after the scenario %d queues are left, deleted %v", sc.name, left, deleted)
		}
	}
	if err := q.prefill(ctx); err != nil {
		t.Fatal(err)
	}
	// Each client count reads the whole queue with groups of its own.
	consumes := 0
	for _, sc := range cfg.scenarios() {
		switch sc.kind {
		case kindPopAck:
			r := q.popAck(ctx, sc, newCPUMeter(0))
			if r.err != nil || r.msgs != int64(cfg.prefill) || r.note != "" {
				t.Fatalf("%s: msgs %d err %v note %q", sc.name, r.msgs, r.err, r.note)
			}
			consumes++
		case kindFanOut:
			r := q.fanOut(ctx, sc, newCPUMeter(0))
			if r.err != nil || r.msgs != int64(cfg.prefill*cfg.fanGroups) {
				t.Fatalf("%s: msgs %d err %v", sc.name, r.msgs, r.err)
			}
			consumes++
		}
	}
	if consumes != 2*len(cfg.clients) {
		t.Fatalf("%d consume scenarios for %d client counts", consumes, len(cfg.clients))
	}
	r := q.latency(ctx, newCPUMeter(0))
	if r.err != nil || r.msgs == 0 || r.note != "" {
		t.Fatalf("latency: msgs %d err %v note %q", r.msgs, r.err, r.note)
	}
}

// TestQueenLatencyAcks: with -latency-ack explicit the latency consumer
// leases and acknowledges every message it receives (a partition stays
// leased until then, so without the acks only one batch would arrive);
// with none it pops with autoAck and sends no acknowledgement.
func TestQueenLatencyAcks(t *testing.T) {
	for _, mode := range []string{latencyAckExplicit, latencyAckNone} {
		t.Run(mode, func(t *testing.T) {
			f := newFakeQueen()
			srv := httptest.NewServer(f)
			defer srv.Close()
			cfg := testConfig(t, srv.URL, "-latency-ack", mode)
			ctx := context.Background()
			q, err := newQueenSystem(ctx, cfg, sysQueen)
			if err != nil {
				t.Fatal(err)
			}
			defer q.close()
			r := q.latency(ctx, newCPUMeter(0))
			if r.err != nil || r.note != "" || r.msgs < 20 {
				t.Fatalf("msgs %d err %v note %q", r.msgs, r.err, r.note)
			}
			f.mu.Lock()
			acked := f.acked
			f.mu.Unlock()
			// Every message sent is received before the run ends, and the
			// receiver returns only after acknowledging its last batch.
			sent := int((cfg.warmup + cfg.latDur) / (time.Second / time.Duration(cfg.latRate)))
			want := 0
			if mode == latencyAckExplicit {
				want = sent
			}
			if acked != want {
				t.Fatalf("%d of %d messages acknowledged, want %d", acked, sent, want)
			}
		})
	}
}

func TestQueenReportsServerBug(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			writeJSON(w, 200, map[string]string{"status": "healthy"})
			return
		}
		writeJSON(w, 200, map[string]any{"configured": true, "queue": "x"}) // wrong queue, wrong status for push
	}))
	defer srv.Close()
	cfg := testConfig(t, srv.URL)
	q, err := newQueenSystem(context.Background(), cfg, sysQueen)
	if err != nil {
		t.Fatal(err)
	}
	r := q.push(context.Background(), scenario{kind: kindPush, batch: 1, size: 30, partitions: 1}, newCPUMeter(0))
	if r.err == nil || !strings.Contains(r.err.Error(), "POST /api/v1/configure with body") {
		t.Fatalf("want a configure error naming the request, got %v", r.err)
	}
}

func TestHelpers(t *testing.T) {
	for _, n := range []int{16, 30, 1024} {
		p := makePayload(n)
		if len(p) != n || !json.Valid(p) {
			t.Errorf("makePayload(%d) = %q (%d bytes)", n, p, len(p))
		}
	}
	now := time.Now()
	got, err := parseSendTime(appendLatencyPayload(nil, now))
	if err != nil || got != now.UnixNano() {
		t.Errorf("parseSendTime = %d, %v", got, err)
	}
	if _, err := parseSendTime([]byte(`{"t": 12, "s":"x"}`)); err != nil {
		t.Errorf("parseSendTime with a space: %v", err)
	}
	lat := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if p := percentile(lat, 50); p != 5 {
		t.Errorf("p50 = %d", p)
	}
	if p := percentile(lat, 99); p != 10 {
		t.Errorf("p99 = %d", p)
	}
	if s := string(appendJSONString(nil, `a"b`)); s != `"a\"b"` {
		t.Errorf("appendJSONString = %s", s)
	}
}

// TestReplyDecoders checks the consumers' fastjson decoding against
// encoding/json on replies shaped like queen's, escapes and nulls included.
func TestReplyDecoders(t *testing.T) {
	pops := []string{
		`{"success":true,"queue":"q","leaseId":"L1","messages":[` +
			`{"id":"a","transactionId":"t\"1\\u00e9","partitionId":"p-1","leaseId":"L1","attempt":1,"data":{"x":[1,"two",null]}},` +
			`{"id":"b","transactionId":"t2","partitionId":"p-2","leaseId":null,"attempt":3,"data":"s\n"}]}`,
		`{"success":true,"leaseId":"L2","messages":[]}`,
		`{"success":true,"messages":null}`,
	}
	var p fastjson.Parser
	for _, body := range pops {
		var want, got popReply
		if err := json.Unmarshal([]byte(body), &want); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		if err := decodePopReply(&p, []byte(body), &got, true); err != nil {
			t.Fatalf("decodePopReply(%s): %v", body, err)
		}
		if want.Success != got.Success || want.LeaseID != got.LeaseID || len(want.Messages) != len(got.Messages) {
			t.Fatalf("%s: got %+v, want %+v", body, got, want)
		}
		for i := range want.Messages {
			w, g := want.Messages[i], got.Messages[i]
			var wd, gd any
			_ = json.Unmarshal(w.Data, &wd)
			_ = json.Unmarshal(g.Data, &gd)
			if w.TransactionID != g.TransactionID || w.PartitionID != g.PartitionID || w.LeaseID != g.LeaseID ||
				w.Attempt != g.Attempt || fmt.Sprint(wd) != fmt.Sprint(gd) {
				t.Fatalf("%s: message %d: got %+v, want %+v", body, i, g, w)
			}
		}
	}
	for _, bad := range []string{`{"messages":[1]}`, `{"messages":{}}`, `{"messages":[`} {
		var r popReply
		if err := decodePopReply(&p, []byte(bad), &r, false); err == nil {
			t.Errorf("decodePopReply(%s) = nil error, want one", bad)
		}
	}
	ack := `[{"index":0,"transactionId":"a","success":true,"error":null},{"index":1,"success":false,"error":"lease \"x\" expired"}]`
	var want []ackItem
	if err := json.Unmarshal([]byte(ack), &want); err != nil {
		t.Fatal(err)
	}
	got, err := decodeAckReply(&p, []byte(ack), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || got[0].Success != want[0].Success || got[0].Error != nil ||
		got[1].Success || got[1].Index != 1 || got[1].Error == nil || *got[1].Error != *want[1].Error {
		t.Fatalf("ack reply: got %+v, want %+v", got, want)
	}
	if _, err := decodeAckReply(&p, []byte(`{"error":"x"}`), nil); err == nil {
		t.Error("decodeAckReply of an object: want an error")
	}
}

// TestFlagDefaults: by default the bench runs both JetStream settings and
// both queen settings, each push, pop+ack and fan-out with 4, 16 and 64
// clients; a running queen (-queen-url) cannot be restarted with another
// setting, so queen-interval is left out by default and refused when asked.
func TestFlagDefaults(t *testing.T) {
	cfg, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.systems, ","); got != "js,js-sync,queen,queen-interval" {
		t.Errorf("systems %s", got)
	}
	if !slices.Equal(cfg.clients, []int{4, 16, 64}) {
		t.Errorf("clients %v", cfg.clients)
	}
	names := map[string]bool{}
	consuming := false
	for _, sc := range cfg.scenarios() {
		if names[sc.name] {
			t.Errorf("scenario %q twice", sc.name)
		}
		names[sc.name] = true
		// A JetStream push recreates the stream the consume scenarios read.
		if sc.kind == kindPush && consuming {
			t.Errorf("push scenario %q after a consume scenario", sc.name)
		}
		consuming = consuming || sc.kind == kindPopAck || sc.kind == kindFanOut
	}
	for _, n := range []string{"push b=100 30B 1p c=4", "push b=1 1KiB 100p c=64", "pop+ack b=100 c=16", "fan-out 5 groups c=64", "push→consumer latency 1000/s"} {
		if !names[n] {
			t.Errorf("no scenario %q", n)
		}
	}
	if q := (&queenSystem{sys: sysQueenInterval}); q.fsyncMode() != "interval" || q.name() != sysQueenInterval {
		t.Errorf("queen-interval starts with QUEEN_FSYNC=%s, named %s", q.fsyncMode(), q.name())
	}
	if q := (&queenSystem{sys: sysQueen}); q.fsyncMode() != "always" {
		t.Errorf("queen starts with QUEEN_FSYNC=%s", q.fsyncMode())
	}
	cfg, err = parseFlags([]string{"-queen-url", "http://127.0.0.1:1"})
	if err != nil || strings.Join(cfg.systems, ",") != "js,js-sync,queen" {
		t.Errorf("with -queen-url: systems %v, %v", cfg.systems, err)
	}
	if _, err := parseFlags([]string{"-queen-url", "http://127.0.0.1:1", "-systems", "queen-interval"}); err == nil {
		t.Errorf("queen-interval with -queen-url was accepted")
	}
	if _, err := parseFlags([]string{"-clients", "4,0"}); err == nil || !strings.Contains(err.Error(), "-clients") {
		t.Errorf("-clients 4,0: %v", err)
	}
	if got := fanPerGroup(cfg, scenario{clients: 64}); got != 12 {
		t.Errorf("64 clients over 5 groups: %d per group", got)
	}
	if got := fanPerGroup(cfg, scenario{clients: 4}); got != 1 {
		t.Errorf("4 clients over 5 groups: %d per group", got)
	}
}
