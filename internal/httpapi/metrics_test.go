package httpapi

import (
	"bytes"
	"encoding/json"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

func scrape(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("metrics are not valid Prometheus text: %v", err)
	}
	return fams
}

// value finds the sample of a family whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("metric %s missing", name)
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
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("metric %s has no sample with labels %v", name, want)
	return 0
}

func TestMetricsAfterKnownOperations(t *testing.T) {
	srv := authzServer(t, nil)
	for i := 0; i < 3; i++ {
		expect(t, 201, call(t, srv, "POST", "/api/v1/push", "", map[string]any{"items": []any{
			map[string]any{"queue": "mq", "partition": "a", "payload": i},
			map[string]any{"queue": "mq", "partition": "b", "payload": i},
		}}), "push")
	}
	// One push over two queues, with a duplicate: counted per queue.
	expect(t, 201, call(t, srv, "POST", "/api/v1/push", "", map[string]any{"items": []any{
		map[string]any{"queue": "mq2", "payload": 1, "transactionId": "x"},
		map[string]any{"queue": "mq2", "payload": 1, "transactionId": "x"},
		map[string]any{"queue": "mq3", "payload": 2},
		map[string]any{"queue": "mq2", "payload": 3},
	}}), "push")
	// Group g takes 4 messages and acks 3 of them, fails 1 into the DLQ.
	r := expect(t, 200, call(t, srv, "GET", "/api/v1/pop/queue/mq?batch=4&partitions=2&consumerGroup=g&subscriptionMode=all", "", nil), "pop")
	var p struct {
		LeaseID  string `json:"leaseId"`
		Messages []struct {
			TransactionID string `json:"transactionId"`
			PartitionID   string `json:"partitionId"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(r.body, &p); err != nil || len(p.Messages) != 4 {
		t.Fatalf("pop: %v %s", err, r.body)
	}
	var acks []any
	for i, m := range p.Messages {
		st := "completed"
		if i == 3 {
			st = "dlq"
		}
		acks = append(acks, map[string]any{"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": p.LeaseID, "status": st})
	}
	expect(t, 200, call(t, srv, "POST", "/api/v1/ack/batch", "", map[string]any{"consumerGroup": "g", "acknowledgments": acks}), "ack")

	m := expect(t, 200, call(t, srv, "GET", "/metrics/prometheus", "", nil), "scrape")
	fams := scrape(t, m.body)
	q := map[string]string{"tenant": "default", "queue": "mq"}
	g := map[string]string{"tenant": "default", "queue": "mq", "group": "g"}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"queen_queue_messages", q, 6},
		{"queen_queue_partitions", q, 2},
		{"queen_queue_pending_messages", q, 6},
		{"queen_messages_pushed_total", q, 6},
		{"queen_messages_pushed_total", map[string]string{"tenant": "default", "queue": "mq2"}, 2},
		{"queen_messages_pushed_total", map[string]string{"tenant": "default", "queue": "mq3"}, 1},
		{"queen_messages_popped_total", g, 4},
		{"queen_acks_total", map[string]string{"tenant": "default", "status": "completed"}, 3},
		{"queen_acks_total", map[string]string{"tenant": "default", "status": "dlq"}, 1},
		{"queen_group_lag_messages", g, 2},
		{"queen_group_consumed_messages_total", g, 3},
		{"queen_group_dead_letters", g, 1},
		{"queen_group_skipped_messages_total", g, 0},
		{"queen_http_request_seconds", map[string]string{"tenant": "default", "route": "POST /api/v1/push", "code": "201"}, 4},
		{"queen_raft_leader", nil, 1},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if v := value(t, fams, "queen_raft_applied_index", nil); v < 5 {
		t.Errorf("applied index %v after 5 writes", v)
	}
	if v := value(t, fams, "queen_group_lag_seconds", g); v < 0 || v > 60 {
		t.Errorf("lag seconds %v", v)
	}
}
