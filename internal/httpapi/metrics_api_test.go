package httpapi

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/queen-mq/queen/internal/auth"
)

// samples lists the samples of a family whose labels include want (a label
// wanted as "" must be absent or empty, as in Prometheus).
func samples(fams map[string]*dto.MetricFamily, name string, want map[string]string) []float64 {
	var out []float64
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			out = append(out, m.Gauge.GetValue())
		case m.Counter != nil:
			out = append(out, m.Counter.GetValue())
		case m.Histogram != nil:
			out = append(out, float64(m.Histogram.GetSampleCount()))
		}
	}
	return out
}

type apiPartition struct {
	Groups []struct {
		Group      string  `json:"consumerGroup"`
		Lag        int64   `json:"lag"`
		LagSeconds float64 `json:"lagSeconds"`
	} `json:"consumerGroups"`
}

type apiQueue struct {
	Partitions int64 `json:"partitions"`
	Messages   struct {
		Total   int64 `json:"total"`
		Pending int64 `json:"pending"`
	} `json:"messages"`
	PartitionDetails []apiPartition `json:"partitionDetails"`
}

// lagOf sums a group's lag over the partitions and takes the largest
// lagSeconds among partitions with lag, as the metrics define them.
func (q apiQueue) lagOf(group string) (msgs int64, secs float64) {
	for _, p := range q.PartitionDetails {
		for _, g := range p.Groups {
			if g.Group == group {
				msgs += g.Lag
				if g.Lag > 0 && g.LagSeconds > secs {
					secs = g.LagSeconds
				}
			}
		}
	}
	return msgs, secs
}

// TestMetricsAgreeWithAPI runs a known sequence over real HTTP (pushes and
// acks through /push, /ack and /transaction, a group whose every partition
// is leased, queue mode with a dead letter) and compares each metric with
// what the API answers about the same thing.
func TestMetricsAgreeWithAPI(t *testing.T) {
	srv := authzServer(t, nil)
	const q = "agree"
	pushed := 0
	count := func(r reply, what string) {
		var out []struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(r.body, &out); err != nil {
			t.Fatalf("%s: %v %s", what, err, r.body)
		}
		for _, o := range out {
			if o.Status == "queued" {
				pushed++
			}
		}
	}
	var items []any
	for i := 0; i < 4; i++ {
		items = append(items, map[string]any{"queue": q, "partition": "a", "payload": i}, map[string]any{"queue": q, "partition": "b", "payload": i})
	}
	items = append(items, map[string]any{"queue": q, "partition": "a", "payload": 9, "transactionId": "t-a0"})
	count(expect(t, 201, call(t, srv, "POST", "/api/v1/push", "", map[string]any{"items": items}), "push"), "push")
	// Two more through a transaction (one a duplicate of the push above).
	tr := expect(t, 200, call(t, srv, "POST", "/api/v1/transaction", "", map[string]any{"operations": []any{
		map[string]any{"type": "push", "items": []any{
			map[string]any{"queue": q, "partition": "c", "payload": 1},
			map[string]any{"queue": q, "partition": "c", "payload": 2},
			map[string]any{"queue": q, "partition": "a", "payload": 9, "transactionId": "t-a0"},
		}},
	}}), "transaction push")
	var txr struct {
		Results []struct {
			Items json.RawMessage `json:"items"`
		} `json:"results"`
	}
	if err := json.Unmarshal(tr.body, &txr); err != nil || len(txr.Results) != 1 {
		t.Fatalf("transaction reply %s", tr.body)
	}
	count(reply{body: txr.Results[0].Items}, "transaction push")
	if pushed != 11 {
		t.Fatalf("%d messages stored, want 11", pushed)
	}

	// Group g leases every partition (3 partitions, 11 messages).
	g := pop(t, srv, "", "/api/v1/pop/queue/"+q+"?consumerGroup=g&subscriptionMode=all&batch=11&partitions=3")
	if len(g.Messages) == 0 {
		t.Fatal("group g got nothing")
	}
	poppedG := len(g.Messages)
	// It acks its first message with /ack and its second in a transaction;
	// the rest stay leased.
	acked := 0
	ack := func(m int) map[string]any {
		return map[string]any{"transactionId": g.Messages[m].TransactionID, "partitionId": g.Messages[m].PartitionID,
			"leaseId": g.Messages[m].LeaseID, "consumerGroup": "g", "status": "completed"}
	}
	ar := expect(t, 200, call(t, srv, "POST", "/api/v1/ack", "", ack(0)), "ack")
	if !strings.Contains(string(ar.body), `"success":true`) {
		t.Fatalf("ack: %s", ar.body)
	}
	acked++
	txAck := ack(1)
	txAck["type"] = "ack"
	tr = expect(t, 200, call(t, srv, "POST", "/api/v1/transaction", "", map[string]any{"operations": []any{txAck}}), "transaction ack")
	if !strings.Contains(string(tr.body), `"success":true`) {
		t.Fatalf("transaction ack: %s", tr.body)
	}
	acked++

	// Queue mode takes two, finishes one and dead-letters the other.
	qm := pop(t, srv, "", "/api/v1/pop/queue/"+q+"?batch=2")
	if len(qm.Messages) != 2 {
		t.Fatalf("queue mode got %d messages, want 2", len(qm.Messages))
	}
	var qacks []any
	for i, m := range qm.Messages {
		st := "completed"
		if i == 1 {
			st = "dlq"
		}
		qacks = append(qacks, map[string]any{"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": m.LeaseID, "status": st})
	}
	expect(t, 200, call(t, srv, "POST", "/api/v1/ack/batch", "", map[string]any{"acknowledgments": qacks}), "queue mode acks")

	// Let the oldest unfinished messages age measurably.
	var api apiQueue
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := expect(t, 200, call(t, srv, "GET", "/api/v1/resources/queues/"+q, "", nil), "queue detail")
		if err := json.Unmarshal(r.body, &api); err != nil {
			t.Fatal(err)
		}
		if _, s := api.lagOf("g"); s >= 0.2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lagSeconds of g never reached 0.2 s: %s", r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := time.Now()
	fams := scrape(t, expect(t, 200, call(t, srv, "GET", "/metrics/prometheus", "", nil), "scrape").body)
	again := expect(t, 200, call(t, srv, "GET", "/api/v1/resources/queues/"+q, "", nil), "queue detail")
	var api2 apiQueue
	if err := json.Unmarshal(again.body, &api2); err != nil {
		t.Fatal(err)
	}
	spread := time.Since(before).Seconds()

	var groups struct {
		Groups []struct {
			Name   string `json:"name"`
			Queues []struct {
				Queue    string `json:"queue"`
				Consumed int64  `json:"consumed"`
				DLQ      int64  `json:"dlq"`
			} `json:"queues"`
		} `json:"consumerGroups"`
	}
	gr := expect(t, 200, call(t, srv, "GET", "/api/v1/consumer-groups", "", nil), "consumer groups")
	if err := json.Unmarshal(gr.body, &groups); err != nil {
		t.Fatalf("consumer groups: %v %s", err, gr.body)
	}
	groupStat := func(name string) (consumed, dlq int64) {
		for _, g := range groups.Groups {
			for _, gq := range g.Queues {
				if g.Name == name && gq.Queue == q {
					return gq.Consumed, gq.DLQ
				}
			}
		}
		t.Fatalf("group %s of %s missing from /api/v1/consumer-groups: %s", name, q, gr.body)
		return 0, 0
	}

	one := func(name string, labels map[string]string) float64 {
		t.Helper()
		s := samples(fams, name, labels)
		if len(s) != 1 {
			t.Errorf("%s%v: %d samples, want 1", name, labels, len(s))
			return math.NaN()
		}
		return s[0]
	}
	ql := map[string]string{"tenant": "default", "queue": q}
	gl := map[string]string{"tenant": "default", "queue": q, "group": "g"}
	exact := []struct {
		name   string
		labels map[string]string
		want   float64
		api    string
	}{
		{"queen_queue_messages", ql, float64(api.Messages.Total), "messages.total"},
		{"queen_queue_partitions", ql, float64(api.Partitions), "partitions"},
		{"queen_queue_pending_messages", ql, float64(api.Messages.Pending), "messages.pending"},
		{"queen_messages_pushed_total", ql, float64(pushed), "queued push replies (/push and /transaction)"},
		{"queen_acks_total", map[string]string{"tenant": "default", "status": "completed"}, float64(acked + 1), "successful acks (/ack, /transaction, queue mode)"},
		{"queen_acks_total", map[string]string{"tenant": "default", "status": "dlq"}, 1, "dead-lettering acks"},
		{"queen_messages_popped_total", gl, float64(poppedG), "messages in g's pop reply"},
		{"queen_messages_popped_total", map[string]string{"tenant": "default", "queue": q, "group": ""}, 2, "messages in the queue-mode pop reply"},
	}
	lagMsgs, _ := api.lagOf("g")
	consumed, dlq := groupStat("g")
	_, qmDLQ := groupStat("__QUEUE_MODE__")
	exact = append(exact, []struct {
		name   string
		labels map[string]string
		want   float64
		api    string
	}{
		{"queen_group_lag_messages", gl, float64(lagMsgs), "the sum of g's partition lag"},
		{"queen_group_consumed_messages_total", gl, float64(consumed), "consumer-groups consumed"},
		{"queen_group_dead_letters", gl, float64(dlq), "consumer-groups dlq"},
		{"queen_queue_dead_letters", ql, float64(qmDLQ), "consumer-groups dlq of queue mode"},
	}...)
	for _, c := range exact {
		if got := one(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v; the API says %v (%s)", c.name, c.labels, got, c.want, c.api)
		}
	}
	// Ages: the scrape lies between the two API reads.
	ages := []struct {
		name   string
		labels map[string]string
		group  string
	}{
		{"queen_group_lag_seconds", gl, "g"},
		{"queen_queue_pending_seconds", ql, "__QUEUE_MODE__"},
	}
	for _, a := range ages {
		_, lo := api.lagOf(a.group)
		_, hi := api2.lagOf(a.group)
		got := one(a.name, a.labels)
		if lo <= 0 || got < lo-0.001 || got > hi+spread+0.001 {
			t.Errorf("%s%v = %.3f; the API said %.3f before and %.3f after (lagSeconds of %s)", a.name, a.labels, got, lo, hi, a.group)
		}
	}
	// Queue mode has no group series.
	for name, f := range fams {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "group" && l.GetValue() == "__QUEUE_MODE__" {
					t.Errorf("%s has a series for group __QUEUE_MODE__; queue mode is reported per queue", name)
				}
			}
		}
	}
}

// TestMetricsAccess: with auth on, tenant series need a token of that
// tenant or QUEEN_METRICS_TOKEN; without a token only series that name no
// tenant are served; an unknown token is 401.
func TestMetricsAccess(t *testing.T) {
	const metricsTok = "metrics-token-0123456789abcdef"
	a := authzTokens(t, auth.Config{})
	srv := httptest.NewServer(New(authzBroker(t), Config{Auth: a, MetricsToken: metricsTok}))
	t.Cleanup(srv.Close)
	push(t, srv, tokAlphaWrite, "alpha-secret-queue", 1)
	push(t, srv, tokBetaAdmin, "beta-secret-queue", 1)

	tenants := func(tok string) (map[string]bool, map[string]*dto.MetricFamily) {
		t.Helper()
		r := expect(t, 200, call(t, srv, "GET", "/metrics/prometheus", tok, nil), "scrape with "+tok)
		if tok == "" && (strings.Contains(string(r.body), "secret-queue") || strings.Contains(string(r.body), "alpha") || strings.Contains(string(r.body), "beta")) {
			t.Errorf("a scrape without a token names tenants or queues:\n%s", r.body)
		}
		fams := scrape(t, r.body)
		seen := map[string]bool{}
		for _, f := range fams {
			for _, m := range f.Metric {
				if tn, ok := tenantLabel(m); ok {
					seen[tn] = true
				}
			}
		}
		return seen, fams
	}
	for _, c := range []struct {
		tok  string
		want string
	}{
		{"", ""},
		{tokAlphaRead, "alpha"},
		{tokBetaAdmin, "beta"},
		{metricsTok, "alpha,beta"},
		{tokOperator, "alpha,beta"},
	} {
		seen, fams := tenants(c.tok)
		var got []string
		for _, tn := range []string{"alpha", "beta"} {
			if seen[tn] {
				got = append(got, tn)
			}
		}
		if strings.Join(got, ",") != c.want || len(seen) != len(got) {
			t.Errorf("token %q sees tenants %v, want %q", c.tok, seen, c.want)
		}
		// Series without a tenant are always there.
		if v := samples(fams, "queen_raft_leader", nil); len(v) != 1 || v[0] != 1 {
			t.Errorf("token %q: queen_raft_leader = %v, want [1]", c.tok, v)
		}
		if c.want != "" {
			tn := strings.Split(c.want, ",")[0]
			if v := samples(fams, "queen_queue_messages", map[string]string{"tenant": tn, "queue": tn + "-secret-queue"}); len(v) != 1 || v[0] != 1 {
				t.Errorf("token %q: queen_queue_messages of %s = %v, want [1]", c.tok, tn, v)
			}
		}
	}
	r := call(t, srv, "GET", "/metrics/prometheus", "not-a-token", nil)
	expectError(t, 401, "unauthorized", r, "scrape with an unknown token")
	if !strings.Contains(fmt.Sprint(r.json(t)["message"]), "QUEEN_METRICS_TOKEN") {
		t.Errorf("401 does not name QUEEN_METRICS_TOKEN: %s", r.body)
	}
}
