package e2e

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestInvalidUTF8 sends bytes that are not UTF-8 in every place the API
// takes text: each is refused with 400 naming the field, the same way
// everywhere, and nothing is stored.
func TestInvalidUTF8(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	s.pushN(t, "utf-q", "p", 1)
	before := s.queues(t)
	cases := []struct {
		name, method, path, body, field string
	}{
		{"push partition", "POST", "/api/v1/push", "{\"items\":[{\"queue\":\"utf-q\",\"partition\":\"p\xff\",\"payload\":1}]}", "items[0].partition"},
		{"push second partition", "POST", "/api/v1/push", "{\"items\":[{\"queue\":\"utf-q\",\"payload\":1},{\"queue\":\"utf-q\",\"partition\":\"p\xfe\",\"payload\":1}]}", "items[1].partition"},
		{"push payload", "POST", "/api/v1/push", "{\"items\":[{\"queue\":\"utf-q\",\"payload\":{\"t\":[\"ok\",\"\xff\"]}}]}", "items[0].payload.t[1]"},
		{"push queue", "POST", "/api/v1/push", "{\"items\":[{\"queue\":\"q\xff\",\"payload\":1}]}", "items[0].queue"},
		{"push key", "POST", "/api/v1/push", "{\"items\":[{\"queue\":\"utf-q\",\"payload\":{\"k\xff\":1}}]}", "items[0].payload"},
		{"transaction", "POST", "/api/v1/transaction", "{\"operations\":[{\"type\":\"push\",\"items\":[{\"queue\":\"utf-q\",\"partition\":\"\xff\",\"payload\":1}]}]}", "operations[0].items[0].partition"},
		{"kv value", "PUT", "/api/v1/kv/k1", "{\"value\":\"\xff\"}", "value"},
		{"configure namespace", "POST", "/api/v1/configure", "{\"queue\":\"utf-q\",\"namespace\":\"n\xff\"}", "namespace"},
		{"configure option", "POST", "/api/v1/configure", "{\"queue\":\"utf-q\",\"options\":{\"note\":\"\xc3\"}}", "options.note"},
		{"ack error", "POST", "/api/v1/ack", "{\"transactionId\":\"x\",\"partitionId\":\"1\",\"status\":\"failed\",\"error\":\"\xff\"}", "error"},
		{"pop partition", "GET", "/api/v1/pop/queue/utf-q/partition/p%FF", "", "partition"},
		{"pop group", "GET", "/api/v1/pop/queue/utf-q?consumerGroup=g%FF", "", "consumerGroup"},
		{"queue path", "GET", "/api/v1/resources/queues/q%FF", "", "queue"},
		{"kv key", "PUT", "/api/v1/kv/a%FFb", `{"value":1}`, "key"},
		{"kv prefix", "GET", "/api/v1/kv?prefix=%FE", "", "prefix"},
		{"dlq partition", "GET", "/api/v1/dlq?partition=%FF", "", "partition"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body any
			if tc.body != "" {
				body = tc.body
			}
			e := s.expectError(t, tc.method, tc.path, body, 400, "invalid_parameter", "")
			if e.Field != tc.field {
				t.Errorf("field %q, want %q (%s)", e.Field, tc.field, e.Message)
			}
			if !strings.Contains(e.Message, "UTF-8") {
				t.Errorf("the message should say UTF-8: %q", e.Message)
			}
			if tc.name == "push queue" || tc.name == "queue path" || tc.name == "pop partition" {
				if !strings.Contains(e.Message, "0xff") {
					t.Errorf("the message should name the byte sent (0xff): %q", e.Message)
				}
			}
		})
	}
	if after := s.queues(t); !reflect.DeepEqual(before, after) {
		t.Errorf("refused requests changed the queues:\nbefore %v\nafter  %v", before, after)
	}
	s.expectError(t, "GET", "/api/v1/kv/k1", nil, 404, "key_not_found", "")
	// Valid UTF-8 beyond ASCII is stored and returned exactly.
	s.push(t, "{\"items\":[{\"queue\":\"utf-q\",\"partition\":\"p\u00e9\",\"payload\":\"\u65e5\u672c\"}]}")
	m := s.mustPop(t, "utf-q", "consumerGroup=g&subscriptionMode=all&batch=10&partitions=10", 2)
	var found bool
	for _, msg := range m.Messages {
		if msg.Partition == "p\u00e9" {
			found = true
			var v string
			if err := json.Unmarshal(msg.Data, &v); err != nil || v != "\u65e5\u672c" {
				t.Errorf("payload %s, want \"\u65e5\u672c\" (%v)", msg.Data, err)
			}
		}
	}
	if !found {
		t.Errorf("no message in partition p\u00e9: %+v", m.Messages)
	}
}

// TestOptionLimits: a queue's namespace, task and extra options are bounded
// in size and nesting; ordinary values are still stored and echoed.
func TestOptionLimits(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	many := map[string]any{}
	for i := 0; i < 65; i++ {
		many["x"+strings.Repeat("o", i)] = i
	}
	cases := []struct {
		name  string
		body  any
		field string
	}{
		{"namespace 1 MB", M{"queue": "opt-q", "namespace": strings.Repeat("n", 1<<20)}, "namespace"},
		{"namespace 257", M{"queue": "opt-q", "namespace": strings.Repeat("n", 257)}, "namespace"},
		{"task 257", M{"queue": "opt-q", "task": strings.Repeat("t", 257)}, "task"},
		{"priority 5000 deep", `{"queue":"opt-q","options":{"priority":` + deep + `}}`, "options.priority"},
		{"option 5 KB", M{"queue": "opt-q", "options": M{"note": strings.Repeat("x", 5000)}}, "options.note"},
		{"65 options", M{"queue": "opt-q", "options": many}, "options"},
		{"long option name", M{"queue": "opt-q", "options": M{strings.Repeat("k", 129): 1}}, "options"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := s.expectError(t, "POST", "/api/v1/configure", tc.body, 400, "invalid_parameter", "")
			if e.Field != tc.field {
				t.Errorf("field %q, want %q (%s)", e.Field, tc.field, e.Message)
			}
		})
	}
	if _, ok := s.queues(t)["opt-q"]; ok {
		t.Fatalf("a refused configure created the queue")
	}
	ok := M{"queue": "opt-q", "namespace": strings.Repeat("n", 256), "task": "t",
		"options": M{"priority": 5, "tags": M{"a": []any{1, M{"b": 2}}}}}
	var reply struct {
		Options map[string]any `json:"options"`
	}
	s.callJSON(t, "POST", "/api/v1/configure", ok, 200, &reply)
	if reply.Options["priority"] != float64(5) || reply.Options["tags"] == nil {
		t.Fatalf("options not stored: %v", reply.Options)
	}
}

// TestSmallerGaps covers the small validation gaps: a string where an
// integer option belongs, a consumer group no group can have, a negative
// offset's message, the index of a bad push item, the KV ttlMs field, and
// the byte named for a bad queue name.
func TestSmallerGaps(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	s.pushN(t, "gap-q", "p", 1)

	t.Run("leaseTime string", func(t *testing.T) {
		e := s.expectError(t, "POST", "/api/v1/configure", `{"queue":"gap-q","options":{"leaseTime":"10"}}`, 400, "invalid_parameter", "")
		if e.Field != "options.leaseTime" || !strings.Contains(e.Message, "number") {
			t.Errorf("leaseTime as a string: %+v", e)
		}
	})
	for _, m := range []string{"GET", "DELETE"} {
		t.Run("dlq group "+m, func(t *testing.T) {
			e := s.expectError(t, m, "/api/v1/dlq?queue=gap-q&consumerGroup=a%20b", nil, 400, "invalid_parameter", "")
			if e.Field != "consumerGroup" {
				t.Errorf("%s dlq consumerGroup=a b: %+v", m, e)
			}
		})
	}
	t.Run("negative offset", func(t *testing.T) {
		e := s.expectError(t, "POST", "/api/v1/ack", `{"transactionId":"x","partitionId":"1","offset":-1,"status":"completed"}`, 400, "invalid_parameter", "")
		if e.Field != "offset" || strings.Contains(e.Message, "not number") || !strings.Contains(e.Message, "-1") {
			t.Errorf("offset -1: %+v", e)
		}
	})
	t.Run("item index", func(t *testing.T) {
		e := s.expectError(t, "POST", "/api/v1/push", `{"items":[{"queue":"gap-q","payload":1},{"queue":5,"payload":1}]}`, 400, "invalid_parameter", "")
		if e.Field != "items[1].queue" {
			t.Errorf("queue of item 1 a number: %+v", e)
		}
		e = s.expectError(t, "POST", "/api/v1/transaction", `{"operations":[{"type":"kv.put","key":"k","value":1},{"type":"push","items":[{"queue":"gap-q","payload":1},{"queue":"gap-q","partition":[],"payload":1}]}]}`, 400, "invalid_parameter", "")
		if e.Field != "operations[1].items[1].partition" {
			t.Errorf("partition of a transaction's item an array: %+v", e)
		}
	})
	t.Run("kv ttlMs", func(t *testing.T) {
		e := s.expectError(t, "PUT", "/api/v1/kv/k", `{"value":1,"ttlMs":-1}`, 400, "invalid_parameter", "")
		if e.Field != "ttlMs" || strings.Contains(e.Message, "operations") {
			t.Errorf("KV PUT ttlMs -1: %+v", e)
		}
	})
	t.Run("queue byte", func(t *testing.T) {
		e := s.expectError(t, "GET", "/api/v1/resources/queues/a%C3%A9", nil, 400, "invalid_parameter", "queue")
		if !strings.Contains(e.Message, "0xc3") {
			t.Errorf("a non-ASCII queue name should be reported by the byte sent (0xc3): %+v", e)
		}
	})
}
