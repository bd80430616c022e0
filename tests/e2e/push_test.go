package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
)

func TestPush(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	t.Run("ReplyShape", func(t *testing.T) {
		t.Parallel()
		items := []pushItem{
			{Queue: "push-shape", Partition: "p1", Payload: M{"a": 1}, TransactionID: "tx-a"},
			{Queue: "push-shape", Partition: "p2", Payload: "b"},
			{Queue: "push-shape", Partition: "p1", Payload: []int{3}},
			{Queue: "push-shape", Payload: nil},
		}
		r := s.callJSON(t, "POST", "/api/v1/push", M{"items": items}, 201, nil)
		// partition_id and message_id are strings on the wire.
		var raw []map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &raw); err != nil || len(raw) != len(items) {
			t.Fatalf("want a JSON array of %d entries: %v\n%s", len(items), err, r)
		}
		for i, e := range raw {
			for _, k := range []string{"index", "status", "transaction_id", "message_id", "partition_id", "offset", "queueName"} {
				if _, ok := e[k]; !ok {
					t.Errorf("entry %d lacks %q:\n%s", i, k, r)
				}
			}
			for _, k := range []string{"partition_id", "message_id", "transaction_id"} {
				if v := e[k]; len(v) == 0 || v[0] != '"' {
					t.Errorf("entry %d: %s must be a JSON string, got %s", i, k, v)
				}
			}
		}
		var out []pushResult
		json.Unmarshal(r.Body, &out)
		ids := map[string]bool{}
		for i, o := range out {
			if o.Index != i || o.Status != "queued" || o.QueueName != "push-shape" || o.MessageID == "" || o.TransactionID == "" || o.PartitionID == "" {
				t.Errorf("entry %d: %+v", i, o)
			}
			if ids[o.MessageID] {
				t.Errorf("entry %d: message_id %s reused", i, o.MessageID)
			}
			ids[o.MessageID] = true
		}
		if out[0].TransactionID != "tx-a" {
			t.Errorf("transaction_id: want the given tx-a, got %q", out[0].TransactionID)
		}
		if out[0].PartitionID != out[2].PartitionID {
			t.Errorf("items 0 and 2 share partition p1 but got partition ids %s and %s", out[0].PartitionID, out[2].PartitionID)
		}
		if out[0].PartitionID == out[1].PartitionID || out[1].PartitionID == out[3].PartitionID {
			t.Errorf("different partitions share an id: %+v", out)
		}
		if out[2].Offset != out[0].Offset+1 {
			t.Errorf("offsets within p1: %d then %d, want consecutive", out[0].Offset, out[2].Offset)
		}
		if q := s.queueTotal(t, "push-shape"); q != 4 {
			t.Errorf("queue total %d, want 4", q)
		}
		// A generated transaction id is a UUIDv7.
		if id := out[1].TransactionID; len(id) != 36 || id[14] != '7' {
			t.Errorf("generated transaction_id %q is not a UUIDv7", id)
		}
	})

	t.Run("PayloadByteForByte", func(t *testing.T) {
		t.Parallel()
		payloads := []string{
			`{"n": 1.50, "big": 123456789012345678901234567890}`,
			`{"n":1.50,"big":123456789012345678901234567890}`,
			`123456789012345678901234567890.000000000000000000001`,
			`1e400`,
			`-0.0`,
			`"\u00e9\ud83d\ude00 \"quoted\" \\ \/"`,
			`[1, 2.0, {"x" : [ ] } , null,true,false]`,
			`null`,
			`{"z": 1, "a": 2, "z2": {"b": 1, "a": 0.10}}`,
			`"ünïcödé 日本語 🙂"`,
		}
		for i, p := range payloads {
			q := fmt.Sprintf("payload-%d", i)
			body := `{"items": [{"queue": "` + q + `", "payload": ` + p + `}]}`
			s.push(t, body)
			m := s.mustPop(t, q, "", 1).Messages[0]
			if !bytes.Equal(m.Data, []byte(p)) {
				t.Errorf("payload %d changed:\n sent   %s\n popped %s", i, p, m.Data)
			}
		}
	})

	t.Run("DefaultPartition", func(t *testing.T) {
		t.Parallel()
		res := s.push(t, []pushItem{{Queue: "push-default", Payload: 1}})
		m := s.mustPop(t, "push-default", "", 1).Messages[0]
		if m.Partition != "Default" {
			t.Errorf("partition of a message that names none: %q, want \"Default\"", m.Partition)
		}
		if m.PartitionID != res[0].PartitionID || m.ID != res[0].MessageID || m.TransactionID != res[0].TransactionID || m.Offset != res[0].Offset {
			t.Errorf("popped %+v does not match pushed %+v", m, res[0])
		}
		// Naming "Default" explicitly is the same partition.
		res2 := s.push(t, []pushItem{{Queue: "push-default", Partition: "Default", Payload: 2}})
		if res2[0].PartitionID != res[0].PartitionID {
			t.Errorf("partition \"Default\" has id %s, the implicit default %s", res2[0].PartitionID, res[0].PartitionID)
		}
	})

	t.Run("DuplicateTransactionID", func(t *testing.T) {
		t.Parallel()
		q := "push-dup"
		res := s.push(t, []pushItem{
			{Queue: q, Partition: "p", Payload: 1, TransactionID: "t1"},
			{Queue: q, Partition: "p", Payload: 2, TransactionID: "t1"},
			{Queue: q, Partition: "p", Payload: 3, TransactionID: "t2"},
		})
		if res[0].Status != "queued" || res[2].Status != "queued" {
			t.Fatalf("want queued for items 0 and 2: %+v", res)
		}
		if res[1].Status != "duplicate" || res[1].MessageID != res[0].MessageID || res[1].TransactionID != "t1" ||
			res[1].PartitionID != res[0].PartitionID || res[1].Offset != res[0].Offset {
			t.Errorf("same-request duplicate: want status duplicate with the original's ids %+v, got %+v", res[0], res[1])
		}
		// Across requests.
		again := s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: 4, TransactionID: "t1"}, {Queue: q, Partition: "p", Payload: 5, TransactionID: "t2"}})
		for i, want := range []pushResult{res[0], res[2]} {
			if again[i].Status != "duplicate" || again[i].MessageID != want.MessageID || again[i].Offset != want.Offset {
				t.Errorf("later duplicate %d: want duplicate of %+v, got %+v", i, want, again[i])
			}
		}
		// transactionId is unique within a partition: another partition stores it.
		other := s.push(t, []pushItem{{Queue: q, Partition: "other", Payload: 6, TransactionID: "t1"}})
		if other[0].Status != "queued" || other[0].MessageID == res[0].MessageID {
			t.Errorf("same transactionId in another partition: want queued as a new message, got %+v", other[0])
		}
		if n := s.queueTotal(t, q); n != 3 {
			t.Errorf("queue total %d, want 3 (duplicates are not stored)", n)
		}
		p := s.mustPop(t, q, "batch=100&partitions=10", 3)
		got := dataTexts(t, p.Messages)
		sort.Strings(got)
		if strings.Join(got, ",") != "1,3,6" {
			t.Errorf("stored payloads %v, want 1,3,6 (the originals, not the duplicates)", got)
		}
	})

	t.Run("RepeatedTransactionIDs", func(t *testing.T) {
		t.Parallel()
		// One request names a stored id three times and a new id three
		// times: every repeat answers with the message the id belongs to.
		q := "push-repeat"
		first := s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: 0, TransactionID: "stored"}})
		var items []pushItem
		for _, id := range []string{"stored", "stored", "stored", "fresh", "fresh", "fresh"} {
			items = append(items, pushItem{Queue: q, Partition: "p", Payload: 1, TransactionID: id})
		}
		res := s.push(t, items)
		checkRepeats(t, "push", first[0], res)
		// The same through /transaction, over two push operations.
		var tx struct {
			Results []struct {
				Items []pushResult `json:"items"`
			} `json:"results"`
		}
		ids := [][]string{{"stored", "stored"}, {"stored", "fresh-tx", "fresh-tx", "fresh-tx"}}
		var ops []M
		for _, group := range ids {
			var its []M
			for _, id := range group {
				its = append(its, M{"queue": q, "partition": "p", "payload": 2, "transactionId": id})
			}
			ops = append(ops, M{"type": "push", "items": its})
		}
		r := s.callJSON(t, "POST", "/api/v1/transaction", M{"operations": ops}, 200, &tx)
		if len(tx.Results) != 2 {
			t.Fatalf("transaction reply:\n%s", r)
		}
		checkRepeats(t, "transaction", first[0], append(tx.Results[0].Items, tx.Results[1].Items...))
		if n := s.queueTotal(t, q); n != 3 {
			t.Errorf("queue total %d, want 3 (stored, fresh, fresh-tx)", n)
		}
	})

	t.Run("EmptyPush", func(t *testing.T) {
		t.Parallel()
		// Queen answers an empty push with 201 and an empty array.
		r := s.callJSON(t, "POST", "/api/v1/push", M{"items": []M{}}, 201, nil)
		if strings.TrimSpace(string(r.Body)) != "[]" {
			t.Errorf("empty push: want the body [], got:\n%s", r)
		}
	})

	t.Run("NullOptionalFields", func(t *testing.T) {
		t.Parallel()
		q := "push-null"
		res := s.push(t, `{"items": [{"queue": "push-null", "partition": null, "transactionId": null, "traceId": null, "payload": {"x": 1}}]}`)
		if res[0].Status != "queued" || res[0].TransactionID == "" {
			t.Fatalf("push with nulls: %+v", res[0])
		}
		m := s.mustPop(t, q, "consumerGroup=null&subscriptionMode=null&subscriptionFrom=null&leaseSeconds=null&batch=null&autoAck=null", 1).Messages[0]
		if m.Partition != "Default" {
			t.Errorf("partition null: want Default, got %q", m.Partition)
		}
		if m.TransactionID != res[0].TransactionID {
			t.Errorf("transactionId null: want the generated %q, got %q", res[0].TransactionID, m.TransactionID)
		}
		if m.TraceID != nil {
			t.Errorf("traceId null: want null, got %q", *m.TraceID)
		}
		// A traceId given is returned.
		s.push(t, []pushItem{{Queue: "push-trace", Payload: 1, TraceID: "trace-1"}})
		m2 := s.mustPop(t, "push-trace", "", 1).Messages[0]
		if m2.TraceID == nil || *m2.TraceID != "trace-1" {
			t.Errorf("traceId: want trace-1, got %v", m2.TraceID)
		}
	})

	t.Run("PartitionNames", func(t *testing.T) {
		t.Parallel()
		names := []string{
			"ünïcödé 日本語 🙂",
			"",
			"a\x00b\x01c\n\t\r\x1f\x7f",
			"slash/and%percent?q#frag",
			`quote"back\slash`,
			"\u2028\u2029",
			" leading and trailing ",
			strings.Repeat("é", 64), // 128 bytes
			strings.Repeat("x", 128),
		}
		q := "push-parts"
		// Encode partitions explicitly: omitempty would drop "".
		var raw []M
		for i, n := range names {
			raw = append(raw, M{"queue": q, "partition": n, "payload": M{"i": i}})
		}
		res := s.push(t, M{"items": raw})
		pids := map[string]int{}
		for i, r := range res {
			if j, ok := pids[r.PartitionID]; ok {
				t.Errorf("partitions %q and %q got the same id %s", names[j], names[i], r.PartitionID)
			}
			pids[r.PartitionID] = i
		}
		p := s.mustPop(t, q, fmt.Sprintf("batch=100&partitions=%d", len(names)), len(names))
		seen := map[string]bool{}
		for _, m := range p.Messages {
			i := dataInts(t, []message{m})[0]
			if m.Partition != names[i] {
				t.Errorf("message %d: partition %q, pushed as %q", i, m.Partition, names[i])
			}
			if m.PartitionID != res[i].PartitionID {
				t.Errorf("message %d: partitionId %s, push said %s", i, m.PartitionID, res[i].PartitionID)
			}
			seen[m.Partition] = true
		}
		if len(seen) != len(names) {
			t.Errorf("popped partitions %q, want all of %q", keys(seen), names)
		}
		// The single-partition route with the name escaped in the path, on a
		// second group so the queue-mode leases above do not interfere.
		for i, n := range names {
			if n == "" {
				continue // an empty path segment cannot name a partition in the route
			}
			pp := s.popPartition(t, q, n, "consumerGroup=by-name&subscriptionMode=all")
			if pp == nil || len(pp.Messages) != 1 || pp.Messages[0].Partition != n {
				t.Errorf("GET %s: want the one message of partition %q, got %+v", popPartitionPath(q, n, ""), n, pp)
				continue
			}
			if got := dataInts(t, pp.Messages)[0]; got != i {
				t.Errorf("partition %q: got message %d, want %d", n, got, i)
			}
		}
	})
}

// dataTexts renders each message's data as text.
func dataTexts(t testing.TB, ms []message) []string {
	t.Helper()
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Data)
	}
	return out
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// checkRepeats checks the reply to items stored, stored, stored, new, new,
// new: the first three name the stored message, the last three one new
// message.
func checkRepeats(t *testing.T, what string, stored pushResult, res []pushResult) {
	t.Helper()
	if len(res) != 6 {
		t.Fatalf("%s: %d results, want 6: %+v", what, len(res), res)
	}
	for i := 0; i < 3; i++ {
		if res[i].Status != "duplicate" || res[i].MessageID != stored.MessageID || res[i].PartitionID != stored.PartitionID || res[i].Offset != stored.Offset {
			t.Errorf("%s: item %d repeats a stored id: want a duplicate of %+v, got %+v", what, i, stored, res[i])
		}
	}
	if res[3].Status != "queued" || res[3].MessageID == stored.MessageID {
		t.Errorf("%s: item 3 is a new id: want queued as a new message, got %+v", what, res[3])
	}
	for i := 4; i < 6; i++ {
		if res[i].Status != "duplicate" || res[i].MessageID != res[3].MessageID || res[i].PartitionID != res[3].PartitionID || res[i].Offset != res[3].Offset {
			t.Errorf("%s: item %d repeats item 3: want a duplicate of %+v, got %+v", what, i, res[3], res[i])
		}
	}
}
