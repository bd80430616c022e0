package e2e

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"
)

func TestConfigure(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	defaults := M{
		"leaseTime": 300, "retryLimit": 3, "retryDelay": 0, "delayedProcessing": 0, "windowBuffer": 0, "maxSize": 0,
		"retentionSeconds": 0, "retentionMessages": 0, "completedRetentionSeconds": 0, "encryptionEnabled": false,
	}
	all := M{
		"leaseTime": 60, "retryLimit": 5, "retryDelay": 250, "delayedProcessing": 0, "windowBuffer": 0, "maxSize": 1000,
		"retentionSeconds": 3600, "retentionMessages": 100, "completedRetentionSeconds": 600, "encryptionEnabled": false,
		// Queen's other options: accepted, stored, echoed.
		"priority": 7, "ttl": 3600, "deadLetterQueue": true, "dlqAfterMaxRetries": true, "retentionEnabled": true, "maxWaitTimeSeconds": 30,
	}

	// configureRaw returns the whole reply.
	configureRaw := func(t *testing.T, body M) M {
		t.Helper()
		var out M
		r := s.callJSON(t, "POST", "/api/v1/configure", body, 200, &out)
		if out["configured"] != true || out["queue"] != body["queue"] {
			t.Fatalf("configure: want configured true and the queue:\n%s", r)
		}
		if _, ok := out["options"].(map[string]any); !ok {
			t.Fatalf("configure: reply without options:\n%s", r)
		}
		return out
	}
	checkOptions := func(t *testing.T, what string, got map[string]any, want M) {
		t.Helper()
		for k, v := range want {
			if !jsonEqual(got[k], v) {
				t.Errorf("%s: option %s = %v, want %v", what, k, got[k], v)
			}
		}
	}
	// namespaceTask finds namespace/task in the reply (top level or in options).
	namespaceTask := func(out M) (any, any) {
		ns, task := out["namespace"], out["task"]
		if opts, ok := out["options"].(map[string]any); ok {
			if ns == nil {
				ns = opts["namespace"]
			}
			if task == nil {
				task = opts["task"]
			}
		}
		return ns, task
	}

	t.Run("CreateWithOptions", func(t *testing.T) {
		t.Parallel()
		out := configureRaw(t, M{"queue": "cfg-all", "namespace": "billing", "task": "invoices", "options": all})
		checkOptions(t, "create", out["options"].(map[string]any), all)
		if ns, task := namespaceTask(out); ns != "billing" || task != "invoices" {
			t.Errorf("namespace/task echo: %v/%v, want billing/invoices", ns, task)
		}
		// Omitted options keep their value on update; so do namespace and task.
		out = configureRaw(t, M{"queue": "cfg-all", "options": M{"leaseTime": 120}})
		want := M{}
		for k, v := range all {
			want[k] = v
		}
		want["leaseTime"] = 120
		checkOptions(t, "update leaseTime only", out["options"].(map[string]any), want)
		if ns, task := namespaceTask(out); ns != "billing" || task != "invoices" {
			t.Errorf("namespace/task after an update naming neither: %v/%v", ns, task)
		}
		// null means absent.
		out = configureRaw(t, M{"queue": "cfg-all", "namespace": nil, "task": nil, "options": M{"retryLimit": nil, "priority": nil}})
		checkOptions(t, "update with nulls", out["options"].(map[string]any), want)
		if ns, task := namespaceTask(out); ns != "billing" || task != "invoices" {
			t.Errorf("namespace/task after null: %v/%v", ns, task)
		}
		// The stored leaseTime is in effect: extending a lease without seconds
		// uses it (docs/http-api.md: "default: the queue's leaseTime").
		s.pushN(t, "cfg-all", "p", 1)
		p := s.mustPop(t, "cfg-all", "", 1)
		var ext []struct {
			Success   bool   `json:"success"`
			ExpiresAt string `json:"expiresAt"`
		}
		r := s.callJSON(t, "POST", "/api/v1/lease/"+p.LeaseID+"/extend", M{}, 200, &ext)
		if len(ext) != 1 || !ext[0].Success {
			t.Fatalf("extend:\n%s", r)
		}
		if d := time.Until(parseAPITime(t, "expiresAt", ext[0].ExpiresAt)); d < 110*time.Second || d > 130*time.Second {
			t.Errorf("lease extended by the queue's leaseTime 120 s expires in %v", d.Round(time.Second))
		}
	})

	t.Run("CreateDefaults", func(t *testing.T) {
		t.Parallel()
		out := configureRaw(t, M{"queue": "cfg-defaults"})
		checkOptions(t, "create without options", out["options"].(map[string]any), defaults)
		qs := s.queues(t)
		if q, ok := qs["cfg-defaults"]; !ok || q.Messages.Total != 0 || q.Partitions != 0 {
			t.Errorf("configured queue in the list: %+v (present %v)", q, ok)
		}
		// A queue created by push has the defaults too.
		s.pushN(t, "cfg-pushed", "p", 1)
		out = configureRaw(t, M{"queue": "cfg-pushed"})
		checkOptions(t, "queue created by push", out["options"].(map[string]any), defaults)
	})

	t.Run("OutOfRange", func(t *testing.T) {
		t.Parallel()
		q := "cfg-range"
		before := configureRaw(t, M{"queue": q, "options": M{"leaseTime": 45, "retryLimit": 2}})
		cases := []struct {
			option string
			value  any
		}{
			{"leaseTime", 0},
			{"leaseTime", -5},
			{"leaseTime", "sixty"},
			{"leaseTime", M{"s": 60}},
			{"retryLimit", []int{1}},
			{"leaseTime", 1.5},
			{"retryLimit", -1},
			{"retryDelay", -1},
			{"delayedProcessing", -1},
			{"windowBuffer", -1},
			{"maxSize", -1},
			{"retentionSeconds", -1},
			{"retentionMessages", -1},
			{"completedRetentionSeconds", -1},
			{"encryptionEnabled", "yes"},
			{"retryLimit", 1e30},
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s=%v", c.option, c.value), func(t *testing.T) {
				// The bad option comes with a good one: nothing may change.
				good := "retryDelay"
				if c.option == good {
					good = "windowBuffer"
				}
				s.expectError(t, "POST", "/api/v1/configure", M{"queue": q, "options": M{c.option: c.value, good: 999}},
					400, "invalid_parameter", c.option)
			})
		}
		after := configureRaw(t, M{"queue": q})
		if !reflect.DeepEqual(before["options"], after["options"]) {
			t.Errorf("refused configures changed the options:\n before %v\n after  %v", before["options"], after["options"])
		}
		// A refused configure of a new queue does not create it.
		s.expectError(t, "POST", "/api/v1/configure", M{"queue": "cfg-never", "options": M{"retryLimit": -1}}, 400, "invalid_parameter", "retryLimit")
		if _, ok := s.queues(t)["cfg-never"]; ok {
			t.Errorf("a refused configure created queue cfg-never")
		}
	})

	t.Run("MaxSizeAtomic", func(t *testing.T) {
		t.Parallel()
		q := "cfg-max"
		configureRaw(t, M{"queue": q, "options": M{"maxSize": 5}})
		s.pushN(t, q, "p", 3)
		over := make([]M, 3)
		for i := range over {
			over[i] = M{"queue": q, "partition": "p", "payload": M{"i": 10 + i}}
		}
		s.expectError(t, "POST", "/api/v1/push", M{"items": over}, 429, "queue_full", "")
		if n := s.queueTotal(t, q); n != 3 {
			t.Fatalf("a refused push over maxSize stored %d messages (total %d, want 3)", n-3, n)
		}
		// A request touching another queue as well stores nothing at all.
		mixed := []M{{"queue": "cfg-max-free", "payload": 1}, {"queue": q, "partition": "p", "payload": 2},
			{"queue": q, "partition": "p", "payload": 3}, {"queue": q, "partition": "p", "payload": 4}}
		s.expectError(t, "POST", "/api/v1/push", M{"items": mixed}, 429, "queue_full", "")
		if qs := s.queues(t); qs["cfg-max-free"].Messages.Total != 0 {
			t.Errorf("refused push stored its item for another queue: %+v", qs["cfg-max-free"])
		}
		if n := s.queueTotal(t, q); n != 3 {
			t.Errorf("queue total %d after a refused mixed push, want 3", n)
		}
		s.pushN(t, q, "p", 2)
		s.expectError(t, "POST", "/api/v1/push", M{"items": []M{{"queue": q, "payload": 1}}}, 429, "queue_full", "")
		if n := s.queueTotal(t, q); n != 5 {
			t.Errorf("queue total %d, want 5", n)
		}
		// Duplicates do not count against maxSize.
		p := s.mustPop(t, q, "batch=1", 1)
		dup := s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: 1, TransactionID: p.Messages[0].TransactionID}})
		if dup[0].Status != "duplicate" {
			t.Errorf("duplicate push to a full queue: %+v", dup[0])
		}
	})
}

// jsonEqual compares a decoded JSON value with a Go literal.
func jsonEqual(got, want any) bool {
	b, _ := json.Marshal(want)
	var w any
	json.Unmarshal(b, &w)
	return reflect.DeepEqual(got, w)
}
