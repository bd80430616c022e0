package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"

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
