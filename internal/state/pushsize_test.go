package state

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// TestPushEncodedInPlace: pushSize is the exact length of a push's
// encoding for lengths on either side of the uvarint steps, txnSize that of
// a transaction's, and a Txn whose push ops are encoded in place decodes to
// the same ops; an entry holding them is allocated at its exact length.
func TestPushEncodedInPlace(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 16383, 16384, 70000} {
		s := strings.Repeat("x", n)
		p := &Push{Tenant: s, Retry: true, Items: []PushItem{
			{Queue: "q", Partition: s, TxID: "id", Payload: []byte(s), Generated: true},
			{Queue: s, Partition: "p", TraceID: s, Payload: bytes.Repeat([]byte{7}, n+1), Sealed: true},
		}}
		if b := encodePush(p); len(b) != pushSize(p) || cap(b) != len(b) {
			t.Fatalf("n=%d: encoding of %d bytes (cap %d), pushSize %d", n, len(b), cap(b), pushSize(p))
		}
		v := uint64(5)
		c := &Txn{Tenant: "t", RequiredLeases: []string{s}, Ops: []TxnOp{
			{Type: OpPush, Items: p.Items},
			{Type: OpKVPut, Key: "k", Value: []byte(s), IfVersion: &v},
			{Type: OpPush, Items: p.Items[:1]},
			{Type: OpAck, Ack: AckItem{PartitionID: 3, TxID: s, Offset: &v, Status: "completed", Group: "g", LeaseID: s, Error: s}},
		}}
		if b := encodeTxn(c); len(b) != txnSize(c) || cap(b) != len(b) {
			t.Fatalf("n=%d: txn encoding of %d bytes (cap %d), txnSize %d", n, len(b), cap(b), txnSize(c))
		}
		got, err := decodeTxn(encodeTxn(c))
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if !reflect.DeepEqual(got.Ops[0].Items, p.Items) || !reflect.DeepEqual(got.Ops[2].Items, p.Items[:1]) || string(got.Ops[1].Value) != s || *got.Ops[1].IfVersion != 5 {
			t.Fatalf("n=%d: the txn decoded to %+v", n, got.Ops)
		}
		en, err := EncodeEntry(&Entry{Time: 9, Cmds: []Command{c, p}})
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeEntry(en)
		if err != nil || len(back.Cmds) != 2 || back.Time != 9 {
			t.Fatalf("n=%d: entry %v %+v", n, err, back)
		}
		if cap(en) != len(en) {
			t.Fatalf("n=%d: entry of %d bytes allocated %d", n, len(en), cap(en))
		}
	}
}
