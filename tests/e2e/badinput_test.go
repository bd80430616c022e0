package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// TestBadInput sends malformed and out-of-range requests: each gets the
// documented error, nothing crashes and nothing changes.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := startServer(t, withEnv("QUEEN_MAX_BODY_BYTES", "1024"))
	const q = "bad-q"
	// Baseline state: a queue with messages, a leased message, a group, a dead letter.
	s.pushN(t, q, "p", 3)
	s.configure(t, M{"queue": q, "options": M{"retryLimit": 4}})
	leased := s.mustPop(t, q, "consumerGroup=g&subscriptionMode=all", 1)
	dl := s.mustPop(t, q, "consumerGroup=g2&subscriptionMode=all", 1)
	s.mustAck(t, ackFor(dl.Messages[0], "dlq"))
	// A body just under the limit is fine.
	under := `{"items":[{"queue":"bad-q","partition":"p","payload":"` + strings.Repeat("x", 900) + `"}]}`
	if len(under) > 1024 {
		t.Fatalf("test bug: %d bytes", len(under))
	}
	s.push(t, under)

	snapshot := func() M {
		var out M
		for _, path := range []string{"/api/v1/resources/queues", "/api/v1/resources/queues/" + q, "/api/v1/consumer-groups", "/api/v1/dlq"} {
			var v any
			s.callJSON(t, "GET", path, nil, 200, &v)
			if out == nil {
				out = M{}
			}
			out[path] = v
		}
		return out
	}
	before := snapshot()

	long := strings.Repeat("q", 129)
	longPart := strings.Repeat("p", 129)
	item := func(fields string) string { return `{"items":[{` + fields + `}]}` }
	cases := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		code   string
		field  string // the error's field must contain this
	}{
		// invalid JSON
		{"push truncated", "POST", "/api/v1/push", `{"items": [`, 400, "invalid_json", ""},
		{"push not json", "POST", "/api/v1/push", `not json`, 400, "invalid_json", ""},
		{"push empty body", "POST", "/api/v1/push", ``, 400, "invalid_json", ""},
		{"push trailing garbage", "POST", "/api/v1/push", item(`"queue":"bad-q","payload":1`) + `}`, 400, "invalid_json", ""},
		{"push bad payload json", "POST", "/api/v1/push", item(`"queue":"bad-q","payload":{1:2}`), 400, "invalid_json", ""},
		{"ack not json", "POST", "/api/v1/ack", `{"transactionId": `, 400, "invalid_json", ""},
		{"ack batch not json", "POST", "/api/v1/ack/batch", `[`, 400, "invalid_json", ""},
		{"configure not json", "POST", "/api/v1/configure", `{queue: bad-q}`, 400, "invalid_json", ""},
		{"requeue not json", "POST", "/api/v1/dlq/requeue", `{"queue"`, 400, "invalid_json", ""},
		{"seek not json", "POST", "/api/v1/consumer-groups/g/queues/bad-q/seek", `{`, 400, "invalid_json", ""},
		{"extend not json", "POST", "/api/v1/lease/" + leased.LeaseID + "/extend", `{"seconds": }`, 400, "invalid_json", ""},
		// wrong types
		{"items string", "POST", "/api/v1/push", `{"items": "x"}`, 400, "invalid_parameter", "items"},
		{"items object", "POST", "/api/v1/push", `{"items": {"queue": "bad-q"}}`, 400, "invalid_parameter", "items"},
		{"body array", "POST", "/api/v1/push", `[{"queue": "bad-q", "payload": 1}]`, 400, "invalid_parameter", ""},
		{"queue number", "POST", "/api/v1/push", item(`"queue":5,"payload":1`), 400, "invalid_parameter", "queue"},
		{"partition number", "POST", "/api/v1/push", item(`"queue":"bad-q","partition":7,"payload":1`), 400, "invalid_parameter", "partition"},
		{"transactionId object", "POST", "/api/v1/push", item(`"queue":"bad-q","transactionId":{},"payload":1`), 400, "invalid_parameter", "transactionId"},
		{"missing items", "POST", "/api/v1/push", `{}`, 400, "invalid_parameter", "items"},
		{"missing queue", "POST", "/api/v1/push", item(`"payload":1`), 400, "invalid_parameter", "queue"},
		{"ack status number", "POST", "/api/v1/ack", `{"transactionId":"x","partitionId":"1","status":1}`, 400, "invalid_parameter", "status"},
		{"ack bad status", "POST", "/api/v1/ack", `{"transactionId":"x","partitionId":"1","status":"done"}`, 400, "invalid_parameter", "status"},
		{"ack bad partitionId", "POST", "/api/v1/ack", `{"transactionId":"x","partitionId":"abc","status":"completed"}`, 400, "invalid_parameter", "partitionId"},
		{"ack negative offset", "POST", "/api/v1/ack", `{"offset":-1,"partitionId":"1","status":"completed"}`, 400, "invalid_parameter", "offset"},
		{"ack batch not array", "POST", "/api/v1/ack/batch", `{"acknowledgments":"x"}`, 400, "invalid_parameter", "acknowledgments"},
		{"configure queue number", "POST", "/api/v1/configure", `{"queue":5}`, 400, "invalid_parameter", "queue"},
		{"configure options array", "POST", "/api/v1/configure", `{"queue":"bad-q","options":[1]}`, 400, "invalid_parameter", "options"},
		{"configure bad option", "POST", "/api/v1/configure", `{"queue":"bad-q","options":{"retryLimit":"many"}}`, 400, "invalid_parameter", "retryLimit"},
		{"extend seconds string", "POST", "/api/v1/lease/" + leased.LeaseID + "/extend", `{"seconds":"x"}`, 400, "invalid_parameter", "seconds"},
		{"extend seconds negative", "POST", "/api/v1/lease/" + leased.LeaseID + "/extend", `{"seconds":-5}`, 400, "invalid_parameter", "seconds"},
		{"requeue ids string", "POST", "/api/v1/dlq/requeue", `{"queue":"bad-q","consumerGroup":"g2","ids":"x"}`, 400, "invalid_parameter", "ids"},
		{"requeue bad id", "POST", "/api/v1/dlq/requeue", `{"queue":"bad-q","consumerGroup":"g2","ids":["not-an-id"]}`, 400, "invalid_parameter", "ids"},
		{"seek timestamp garbage", "POST", "/api/v1/consumer-groups/g/queues/bad-q/seek", `{"timestamp":"yesterday"}`, 400, "invalid_parameter", "timestamp"},
		{"subscription garbage", "POST", "/api/v1/consumer-groups/g/subscription", `{"subscriptionTimestamp":"soon"}`, 400, "invalid_parameter", "subscriptionTimestamp"},
		// names
		{"queue empty", "POST", "/api/v1/push", item(`"queue":"","payload":1`), 400, "invalid_parameter", "queue"},
		{"queue 129 bytes", "POST", "/api/v1/push", item(`"queue":"` + long + `","payload":1`), 400, "invalid_parameter", "queue"},
		{"queue slash", "POST", "/api/v1/push", item(`"queue":"a/b","payload":1`), 400, "invalid_parameter", "queue"},
		{"queue space", "POST", "/api/v1/push", item(`"queue":"a b","payload":1`), 400, "invalid_parameter", "queue"},
		{"queue unicode", "POST", "/api/v1/push", item(`"queue":"qué","payload":1`), 400, "invalid_parameter", "queue"},
		{"queue NUL", "POST", "/api/v1/push", item(`"queue":"a\u0000","payload":1`), 400, "invalid_parameter", "queue"},
		{"partition 129 bytes", "POST", "/api/v1/push", item(`"queue":"bad-q","partition":"` + longPart + `","payload":1`), 400, "invalid_parameter", "partition"},
		{"partition 65 two-byte runes", "POST", "/api/v1/push", item(`"queue":"bad-q","partition":"` + strings.Repeat("é", 65) + `","payload":1`), 400, "invalid_parameter", "partition"},
		{"second item bad (atomic)", "POST", "/api/v1/push", `{"items":[{"queue":"bad-q","payload":1},{"queue":"bad q","payload":2}]}`, 400, "invalid_parameter", "queue"},
		{"pop queue 129 bytes", "GET", "/api/v1/pop/queue/" + long, "", 400, "invalid_parameter", "queue"},
		{"pop queue bad chars", "GET", "/api/v1/pop/queue/a%20b", "", 400, "invalid_parameter", "queue"},
		{"pop group bad chars", "GET", "/api/v1/pop/queue/bad-q?consumerGroup=a%20b", "", 400, "invalid_parameter", "consumerGroup"},
		{"pop group 129 bytes", "GET", "/api/v1/pop/queue/bad-q?consumerGroup=" + long, "", 400, "invalid_parameter", "consumerGroup"},
		{"pop partition 129 bytes", "GET", "/api/v1/pop/queue/bad-q/partition/" + longPart, "", 400, "invalid_parameter", "partition"},
		{"configure queue bad", "POST", "/api/v1/configure", `{"queue":"a b"}`, 400, "invalid_parameter", "queue"},
		{"configure queue 129", "POST", "/api/v1/configure", `{"queue":"` + long + `"}`, 400, "invalid_parameter", "queue"},
		{"ack group bad", "POST", "/api/v1/ack", `{"transactionId":"x","partitionId":"1","status":"completed","consumerGroup":"a b"}`, 400, "invalid_parameter", "consumerGroup"},
		// pop parameters out of range: refused, never clamped
		{"batch=0", "GET", "/api/v1/pop/queue/bad-q?batch=0", "", 400, "invalid_parameter", "batch"},
		{"batch=10001", "GET", "/api/v1/pop/queue/bad-q?batch=10001", "", 400, "invalid_parameter", "batch"},
		{"batch=-1", "GET", "/api/v1/pop/queue/bad-q?batch=-1", "", 400, "invalid_parameter", "batch"},
		{"batch=abc", "GET", "/api/v1/pop/queue/bad-q?batch=abc", "", 400, "invalid_parameter", "batch"},
		{"batch=1.5", "GET", "/api/v1/pop/queue/bad-q?batch=1.5", "", 400, "invalid_parameter", "batch"},
		{"batch huge", "GET", "/api/v1/pop/queue/bad-q?batch=99999999999999999999999", "", 400, "invalid_parameter", "batch"},
		{"partitions=0", "GET", "/api/v1/pop/queue/bad-q?partitions=0", "", 400, "invalid_parameter", "partitions"},
		{"partitions=10001", "GET", "/api/v1/pop/queue/bad-q?partitions=10001", "", 400, "invalid_parameter", "partitions"},
		{"leaseSeconds=4", "GET", "/api/v1/pop/queue/bad-q?leaseSeconds=4", "", 400, "invalid_parameter", "leaseSeconds"},
		{"leaseSeconds=3601", "GET", "/api/v1/pop/queue/bad-q?leaseSeconds=3601", "", 400, "invalid_parameter", "leaseSeconds"},
		{"leaseSeconds=0", "GET", "/api/v1/pop/queue/bad-q?leaseSeconds=0", "", 400, "invalid_parameter", "leaseSeconds"},
		{"timeout=0 with wait", "GET", "/api/v1/pop/queue/bad-q?wait=true&timeout=0", "", 400, "invalid_parameter", "timeout"},
		{"timeout=0", "GET", "/api/v1/pop/queue/bad-q?timeout=0", "", 400, "invalid_parameter", "timeout"},
		{"timeout=3600001", "GET", "/api/v1/pop/queue/bad-q?wait=true&timeout=3600001", "", 400, "invalid_parameter", "timeout"},
		{"wait=maybe", "GET", "/api/v1/pop/queue/bad-q?wait=maybe", "", 400, "invalid_parameter", "wait"},
		{"autoAck=2", "GET", "/api/v1/pop/queue/bad-q?autoAck=2", "", 400, "invalid_parameter", "autoAck"},
		{"subscriptionMode=bogus", "GET", "/api/v1/pop/queue/bad-q?consumerGroup=g9&subscriptionMode=bogus", "", 400, "invalid_parameter", "subscriptionMode"},
		{"subscriptionFrom=bogus", "GET", "/api/v1/pop/queue/bad-q?consumerGroup=g9&subscriptionFrom=yesterday", "", 400, "invalid_parameter", "subscriptionFrom"},
		{"partition route batch=0", "GET", "/api/v1/pop/queue/bad-q/partition/p?batch=0", "", 400, "invalid_parameter", "batch"},
		// unknown routes
		{"unknown route", "GET", "/api/v1/nope", "", 404, "", ""},
		{"unknown version", "POST", "/api/v2/push", `{"items":[]}`, 404, "", ""},
		{"unknown root", "GET", "/nope", "", 404, "", ""},
		{"pop without queue", "GET", "/api/v1/pop/queue/", "", 404, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := s.expectError(t, c.method, c.path, c.body, c.status, c.code, c.field)
			if e.Error == "" {
				t.Errorf("%s %s: reply without \"error\"", c.method, c.path)
			}
			if c.code == "invalid_parameter" && e.Field == "" && c.field != "" {
				t.Errorf("%s %s: invalid_parameter without a field", c.method, c.path)
			}
		})
	}

	// Wrong method on a known path: a JSON error (404, or 405).
	t.Run("wrong method", func(t *testing.T) {
		for _, m := range [][2]string{{"GET", "/api/v1/push"}, {"DELETE", "/api/v1/ack"}, {"PUT", "/api/v1/configure"}} {
			r := s.call(t, m[0], m[1], nil)
			var e apiError
			if (r.Status != 404 && r.Status != 405) || json.Unmarshal(r.Body, &e) != nil || e.Error == "" {
				t.Errorf("want 404 or 405 with a JSON error:\n%s", r)
			}
		}
	})

	t.Run("body over limit", func(t *testing.T) {
		big := `{"items":[{"queue":"bad-q","payload":"` + strings.Repeat("x", 2000) + `"}]}`
		s.expectError(t, "POST", "/api/v1/push", big, 413, "", "")
		for _, path := range []string{"/api/v1/ack/batch", "/api/v1/configure"} {
			s.expectError(t, "POST", path, `{"x":"`+strings.Repeat("y", 2000)+`"}`, 413, "", "")
		}
		// Without a Content-Length (chunked): still 413.
		req, _ := http.NewRequest("POST", s.base+"/api/v1/push", io.MultiReader(strings.NewReader(big)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.hc.Do(req)
		if err != nil {
			t.Fatalf("chunked push: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 413 || !bytes.Contains(b, []byte(`"error"`)) {
			t.Errorf("chunked push of %d bytes over a 1024-byte limit: %d %s", len(big), resp.StatusCode, b)
		}
	})

	t.Run("nothing changed", func(t *testing.T) {
		h := s.call(t, "GET", "/health", nil)
		if h.Status != 200 {
			t.Fatalf("health after bad input:\n%s", h)
		}
		after := snapshot()
		for path, v := range before {
			if path == "/api/v1/resources/queues/"+q {
				// Lag seconds and similar age-based figures move with time;
				// compare the counts only.
				bq, aq := v.(map[string]any), after[path].(map[string]any)
				if !reflect.DeepEqual(bq["messages"], aq["messages"]) || !reflect.DeepEqual(bq["options"], aq["options"]) || bq["partitions"] != aq["partitions"] {
					t.Errorf("%s changed:\n before %v\n after  %v", path, v, after[path])
				}
				continue
			}
			if !reflect.DeepEqual(stripAges(v), stripAges(after[path])) {
				b1, _ := json.Marshal(v)
				b2, _ := json.Marshal(after[path])
				t.Errorf("%s changed:\n before %s\n after  %s", path, b1, b2)
			}
		}
		if n := s.queueTotal(t, q); n != 4 {
			t.Errorf("total %d, want 4", n)
		}
		// The leased message is still leased to g and its lease works.
		s.mustAck(t, ackFor(leased.Messages[0], "completed"))
	})
}

// stripAges removes time-dependent figures (lag in seconds) from a decoded
// JSON value.
func stripAges(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			if k == "lagSeconds" || k == "time" {
				continue
			}
			out[k] = stripAges(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = stripAges(e)
		}
		return out
	default:
		return v
	}
}
