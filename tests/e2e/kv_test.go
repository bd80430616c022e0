package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// TestKVRoutes: the KV routes' shapes and status codes over HTTP.
func TestKVRoutes(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	var put struct {
		Key     string `json:"key"`
		Version uint64 `json:"version"`
	}
	s.callJSON(t, "PUT", "/api/v1/kv/app/config", M{"value": json.RawMessage(`{"n":1.50}`), "ifVersion": 0}, 200, &put)
	if put.Key != "app/config" || put.Version == 0 {
		t.Fatalf("put reply %+v", put)
	}
	var got struct {
		Key       string          `json:"key"`
		Value     json.RawMessage `json:"value"`
		Version   uint64          `json:"version"`
		ExpiresAt *string         `json:"expiresAt"`
	}
	s.callJSON(t, "GET", "/api/v1/kv/app/config", nil, 200, &got)
	if string(got.Value) != `{"n":1.50}` || got.Version != put.Version || got.ExpiresAt != nil {
		t.Fatalf("get reply %+v value %s", got, got.Value)
	}
	// ifVersion 0 on an existing key, and a stale version: 409 with the
	// current version.
	var conflict struct {
		Error   string `json:"error"`
		Version uint64 `json:"version"`
	}
	s.callJSON(t, "PUT", "/api/v1/kv/app/config", M{"value": 2, "ifVersion": 0}, 409, &conflict)
	if conflict.Error != "condition_failed" || conflict.Version != put.Version {
		t.Fatalf("conflict reply %+v", conflict)
	}
	s.callJSON(t, "PUT", "/api/v1/kv/app/config", M{"value": 2, "ifVersion": put.Version + 1000}, 409, nil)
	s.callJSON(t, "PUT", "/api/v1/kv/app/config", M{"value": 2, "ifVersion": put.Version}, 200, &put)
	// Reserved space, bad input.
	s.expectError(t, "PUT", "/api/v1/kv/__queen/connectors/x", M{"value": 1}, 403, "reserved_key", "")
	s.callJSON(t, "GET", "/api/v1/kv/__queen/connectors/x", nil, 404, nil)
	s.expectError(t, "PUT", "/api/v1/kv/k", M{"ifVersion": 0}, 400, "invalid_parameter", "value")
	s.expectError(t, "PUT", "/api/v1/kv/k", M{"value": 1, "ttlMs": -1}, 400, "invalid_parameter", "ttlMs")
	// TTL: gone shortly after.
	s.callJSON(t, "PUT", "/api/v1/kv/short", M{"value": "x", "ttlMs": 200}, 200, nil)
	if err := checkFor(5*time.Second, 20*time.Millisecond, func() error {
		if r := s.call(t, "GET", "/api/v1/kv/short", nil); r.Status != 404 {
			return fmt.Errorf("still %d", r.Status)
		}
		return nil
	}); err != nil {
		t.Fatalf("TTL key: %v", err)
	}
	// List with a prefix and paging; delete with a condition.
	for _, k := range []string{"app/a", "app/b", "other"} {
		s.callJSON(t, "PUT", "/api/v1/kv/"+k, M{"value": k}, 200, nil)
	}
	var list struct {
		Keys []struct {
			Key string `json:"key"`
		} `json:"keys"`
		NextAfter string `json:"nextAfter"`
	}
	s.callJSON(t, "GET", "/api/v1/kv?prefix=app/&limit=2", nil, 200, &list)
	if len(list.Keys) != 2 || list.Keys[0].Key != "app/a" || list.NextAfter != "app/b" {
		t.Fatalf("first page %+v", list)
	}
	s.callJSON(t, "GET", "/api/v1/kv?prefix=app/&limit=2&after="+list.NextAfter, nil, 200, &list)
	if len(list.Keys) != 1 || list.Keys[0].Key != "app/config" {
		t.Fatalf("second page %+v", list)
	}
	s.callJSON(t, "DELETE", "/api/v1/kv/app/config?ifVersion=1", nil, 409, nil)
	var del struct {
		Deleted bool `json:"deleted"`
	}
	s.callJSON(t, "DELETE", "/api/v1/kv/app/config", nil, 200, &del)
	if !del.Deleted {
		t.Fatal("delete reported nothing deleted")
	}
	s.expectError(t, "GET", "/api/v1/kv/app/config", nil, 404, "key_not_found", "")
}

// TestTransactionRoute: all-or-nothing over HTTP, the 409 shape, and a
// harmless retry.
func TestTransactionRoute(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	s.pushN(t, "txq", "p", 2)
	p := s.mustPop(t, "txq", "batch=1&consumerGroup=w&subscriptionMode=all", 1)
	m := p.Messages[0]
	ops := []M{
		{"type": "push", "items": []M{{"queue": "out", "partition": "p", "payload": M{"from": m.ID}, "transactionId": "derived-" + m.ID}}},
		{"type": "ack", "transactionId": m.TransactionID, "partitionId": m.PartitionID, "consumerGroup": "w", "leaseId": p.LeaseID, "status": "completed"},
		{"type": "kv.put", "key": "progress/w", "value": M{"offset": m.Offset}, "ifVersion": 0},
		{"type": "kv.check", "key": "missing", "ifVersion": 7},
	}
	var fail struct {
		Success   bool   `json:"success"`
		Error     string `json:"error"`
		Operation *int   `json:"operation"`
	}
	s.callJSON(t, "POST", "/api/v1/transaction", M{"operations": ops, "requiredLeases": []string{p.LeaseID}}, 409, &fail)
	if fail.Success || fail.Error != "condition_failed" || fail.Operation == nil || *fail.Operation != 3 {
		t.Fatalf("409 reply %+v", fail)
	}
	// Nothing happened: no "out" message, the ack did not apply, no KV key.
	s.mustEmpty(t, "out", "consumerGroup=x&subscriptionMode=all")
	s.callJSON(t, "GET", "/api/v1/kv/progress/w", nil, 404, nil)
	ops = ops[:3]
	var ok struct {
		Success bool `json:"success"`
		Results []struct {
			Type    string `json:"type"`
			Success *bool  `json:"success"`
			Version uint64 `json:"version"`
			Items   []struct {
				Status string `json:"status"`
			} `json:"items"`
		} `json:"results"`
	}
	s.callJSON(t, "POST", "/api/v1/transaction", M{"operations": ops, "requiredLeases": []string{p.LeaseID}}, 200, &ok)
	if !ok.Success || len(ok.Results) != 3 || ok.Results[0].Items[0].Status != "queued" || !*ok.Results[1].Success || ok.Results[2].Version == 0 {
		t.Fatalf("commit reply %+v", ok)
	}
	// A retry after a lost reply: the push is a duplicate, the ack a no-op,
	// and the KV condition (now naming the version just written) holds.
	ops[2]["ifVersion"] = ok.Results[2].Version
	s.callJSON(t, "POST", "/api/v1/transaction", M{"operations": ops}, 200, &ok)
	if ok.Results[0].Items[0].Status != "duplicate" || !*ok.Results[1].Success {
		t.Fatalf("retry reply %+v", ok)
	}
	s.expectError(t, "POST", "/api/v1/transaction", M{"operations": []M{{"type": "nope"}}}, 400, "invalid_parameter", "operations[0].type")
	// requiredLeases that is no longer held fails the whole transaction.
	s.callJSON(t, "POST", "/api/v1/transaction", M{"operations": []M{{"type": "kv.put", "key": "z", "value": 1}}, "requiredLeases": []string{"01a227cc-8d7e-7bd4-a13f-9d251241d4ae"}}, 409, nil)
	s.callJSON(t, "GET", "/api/v1/kv/z", nil, 404, nil)
}
