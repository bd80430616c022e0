package state

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// A pop's record, read back, is the pop's result: every field of every
// message, across partitions, requeued messages with their counts, trace
// ids and sealed payloads; and it holds none of the payloads itself.
func TestPopRecordRestoresTheResult(t *testing.T) {
	h := newHarness(t)
	big := strings.Repeat("x", 4096)
	push := &Push{Tenant: "default"}
	for i := 0; i < 5; i++ {
		push.Items = append(push.Items, PushItem{Queue: "q", Partition: "p1", TxID: uuid.NewString(), TraceID: fmt.Sprintf("trace-%d", i), Payload: []byte(fmt.Sprintf(`{"n":%d,"pad":%q}`, i, big))})
	}
	for i := 0; i < 3; i++ {
		push.Items = append(push.Items, PushItem{Queue: "q", Partition: "p2", TxID: uuid.NewString(), Sealed: i == 1, Payload: []byte(fmt.Sprintf(`%d`, i))})
	}
	if r := h.apply(push)[0].(*PushResult); r.Err != nil {
		t.Fatalf("push: %v", r.Err)
	}
	first := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 10, LeaseSeconds: 60})
	if len(first.Messages) != 8 || first.Claimed != 2 {
		t.Fatalf("first pop: %d messages over %d partitions, want 8 over 2", len(first.Messages), first.Claimed)
	}
	checkRestored(t, h, first)

	// Offset 4 of p1 fails and comes back with its counts moved on, just
	// ahead of p1's new messages 5 and 6: consecutive offsets, two runs.
	var p1 uint64
	for _, m := range first.Messages {
		if m.Partition == "p1" {
			p1 = m.PartitionID
		}
	}
	var acks []AckItem
	for _, m := range first.Messages {
		off, status := m.Offset, AckCompleted
		if m.PartitionID == p1 && off == 4 {
			status = AckFailed
		}
		acks = append(acks, AckItem{PartitionID: m.PartitionID, Offset: &off, Status: status, Group: "g", LeaseID: first.LeaseID})
	}
	for _, it := range h.ack(acks...).Items {
		if !it.Success {
			t.Fatalf("ack: %+v", it)
		}
	}
	h.push("q", "p1", `"a"`, `"b"`)
	second := h.pop(Pop{Queue: "q", Group: "g", Partition: ptr("p1"), Batch: 100, Partitions: 1, LeaseSeconds: 60})
	if got := offsets(second); fmt.Sprint(got) != "[4 5 6]" {
		t.Fatalf("second pop offsets %v, want [4 5 6]", got)
	}
	if second.Messages[0].Attempt != 2 || second.Messages[1].Attempt != 1 {
		t.Fatalf("second pop attempts %d, %d; want 2, 1", second.Messages[0].Attempt, second.Messages[1].Attempt)
	}
	rec := checkRestored(t, h, second)
	if len(rec.runs) != 2 {
		t.Errorf("record of offsets 4 (attempt 2), 5, 6 (attempt 1) has %d runs, want 2", len(rec.runs))
	}

	// An empty pop, and one that failed, restore as they were.
	checkRestored(t, h, h.pop(Pop{Queue: "q", Group: "g", Batch: 10, Partitions: 10}))
	checkRestored(t, h, h.apply(&Pop{Tenant: "default", Queue: "q", Group: "g", Batch: 1, LeaseID: "not-a-uuid"})[0].(*PopResult))

	// Once the messages are gone, the answer cannot be given again.
	h.apply(&DeleteQueue{Tenant: "default", Queue: "q"})
	r := h.s.Reader()
	defer r.Close()
	if res, ok := r.RestorePop(first.Record()); ok {
		t.Fatalf("restored a pop of a deleted queue: %d messages", len(res.Messages))
	}
}

// checkRestored records res, reads it back and compares the two.
func checkRestored(t *testing.T, h *harness, res *PopResult) *PopRecord {
	t.Helper()
	rec := res.Record()
	payload := 0
	for _, m := range res.Messages {
		payload += len(m.Payload)
	}
	if payload > 0 && rec.Size() >= payload {
		t.Errorf("record of %d messages keeps %d bytes, more than their %d bytes of payload", len(res.Messages), rec.Size(), payload)
	}
	if rec.Messages() != len(res.Messages) {
		t.Errorf("record counts %d messages, the pop handed out %d", rec.Messages(), len(res.Messages))
	}
	r := h.s.Reader()
	defer r.Close()
	got, ok := r.RestorePop(rec)
	if !ok {
		t.Fatalf("restoring a pop of %d messages failed", len(res.Messages))
	}
	if len(got.Messages) == 0 && len(res.Messages) == 0 {
		got.Messages = res.Messages // nil and empty alike
	}
	if !reflect.DeepEqual(got, res) {
		t.Fatalf("restored pop differs:\n got %+v\nwant %+v", got, res)
	}
	return rec
}
