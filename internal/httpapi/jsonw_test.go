package httpapi

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// ackReply is the ack reply item as a struct, for encoding/json.
type ackReply struct {
	Index         int     `json:"index"`
	TransactionID string  `json:"transactionId"`
	Success       bool    `json:"success"`
	Error         *string `json:"error"`
	LeaseReleased bool    `json:"leaseReleased"`
	DLQ           bool    `json:"dlq"`
}

func TestAckReplyEncoding(t *testing.T) {
	out := []broker.AckOutcome{
		{TxID: "t1", Success: true, LeaseReleased: true},
		{TxID: "weird \"id\"\n\u2028 \xff", Error: "lease_expired"},
		{TxID: "", Success: true, DLQ: true, Error: "x<y>&"},
	}
	want := make([]ackReply, len(out))
	for i, o := range out {
		want[i] = ackReply{Index: i, TransactionID: o.TxID, Success: o.Success, LeaseReleased: o.LeaseReleased, DLQ: o.DLQ}
		if o.Error != "" {
			e := o.Error
			want[i].Error = &e
		}
	}
	wb, _ := json.Marshal(want)
	gb := appendAckReply(nil, out)
	var w, g any
	if err := json.Unmarshal(wb, &w); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(gb, &g); err != nil {
		t.Fatalf("hand-written ack reply is not JSON: %v\n%s", err, gb)
	}
	if !reflect.DeepEqual(w, g) {
		t.Fatalf("ack reply differs:\n hand:          %s\n encoding/json: %s", gb, wb)
	}
	if string(appendAckReply(nil, nil)) != "[]" {
		t.Fatalf("empty ack reply: %s", appendAckReply(nil, nil))
	}
}

// TestAppendTime: the digit-by-digit time formatter writes what
// AppendFormat writes with the layout, for random times and the edges.
func TestAppendTime(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	times := []time.Time{time.Unix(0, 0), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 1, 13, 5, 9, 1000, time.FixedZone("x", 3600))}
	for i := 0; i < 10000; i++ {
		times = append(times, time.UnixMicro(rng.Int63n(400*365*24*3600*1e6)))
	}
	for _, tm := range times {
		want := `"` + tm.UTC().Format(timeLayout) + `"`
		if got := string(appendTime(nil, tm)); got != want {
			t.Fatalf("appendTime(%v) = %s, want %s", tm, got, want)
		}
	}
}

// popReplyJSON is a pop reply as structs, for encoding/json.
type popReplyJSON struct {
	Success           bool             `json:"success"`
	Queue             string           `json:"queue"`
	ConsumerGroup     string           `json:"consumerGroup"`
	LeaseID           string           `json:"leaseId"`
	PartitionsClaimed int              `json:"partitionsClaimed"`
	Messages          []popMessageJSON `json:"messages"`
}

type popMessageJSON struct {
	ID            string          `json:"id"`
	TransactionID string          `json:"transactionId"`
	TraceID       *string         `json:"traceId"`
	Queue         string          `json:"queue"`
	Partition     string          `json:"partition"`
	PartitionID   string          `json:"partitionId"`
	Offset        uint64          `json:"offset"`
	CreatedAt     string          `json:"createdAt"`
	Data          json.RawMessage `json:"data"`
	LeaseID       string          `json:"leaseId"`
	ConsumerGroup string          `json:"consumerGroup"`
	Attempt       uint32          `json:"attempt"`
	RetryCount    uint32          `json:"retryCount"`
}

// TestPopReplyEncoding: the hand-written pop reply (which escapes repeated
// strings once per run) is the JSON encoding/json writes for the same
// reply, with strings that repeat, change and need escaping.
func TestPopReplyEncoding(t *testing.T) {
	resp := &broker.PopResponse{Queue: "q\"1", Group: "g", LeaseID: "l1", Claimed: 2}
	parts := []string{"a", "a", "b\n", "b\n", "a", "\u2028"}
	for i, p := range parts {
		m := broker.Message{ID: fmt.Sprintf("id-%d", i), TxID: fmt.Sprintf("tx \"%d\"", i), Queue: resp.Queue, Partition: p,
			PartitionID: uint64(10 + i), Offset: uint64(i), CreatedAt: time.UnixMicro(1_700_000_000_123_456 + int64(i)),
			Data: []byte(fmt.Sprintf(`{"i":%d}`, i)), LeaseID: []string{"l1", "l2"}[i%2], Group: []string{"g", "g", "h"}[i%3], Attempt: uint32(i), Retries: 1}
		if i%2 == 0 {
			m.TraceID = "tr"
		}
		resp.Messages = append(resp.Messages, m)
	}
	want := popReplyJSON{Success: true, Queue: resp.Queue, ConsumerGroup: resp.Group, LeaseID: resp.LeaseID, PartitionsClaimed: resp.Claimed}
	for _, m := range resp.Messages {
		pm := popMessageJSON{ID: m.ID, TransactionID: m.TxID, Queue: m.Queue, Partition: m.Partition, PartitionID: fmt.Sprint(m.PartitionID),
			Offset: m.Offset, CreatedAt: m.CreatedAt.UTC().Format(timeLayout), Data: m.Data, LeaseID: m.LeaseID, ConsumerGroup: m.Group,
			Attempt: m.Attempt, RetryCount: m.Retries}
		if m.TraceID != "" {
			tr := m.TraceID
			pm.TraceID = &tr
		}
		want.Messages = append(want.Messages, pm)
	}
	wb, _ := json.Marshal(want)
	gb := appendPopReply(nil, resp)
	var w, g any
	if err := json.Unmarshal(wb, &w); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(gb, &g); err != nil {
		t.Fatalf("hand-written pop reply is not JSON: %v\n%s", err, gb)
	}
	if !reflect.DeepEqual(w, g) {
		t.Fatalf("pop reply differs:\n hand:          %s\n encoding/json: %s", gb, wb)
	}
}
