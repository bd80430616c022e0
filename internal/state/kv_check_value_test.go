package state

import (
	"testing"
)

// TestKVCheckValue: a transaction conditioned on a key's value commits only
// while the key holds exactly those bytes, and a refused one changes
// nothing (its pushes are not written). A chain of writes, each
// conditioned on the value the one before wrote, commits in order and
// fails from the first link whose predecessor is missing.
func TestKVCheckValue(t *testing.T) {
	h := newHarness(t)
	txn := func(part string, after, value string) *TxnResult {
		t.Helper()
		ops := []TxnOp{{Type: OpPush, Items: []PushItem{{Queue: "q", Partition: part, Payload: []byte(`1`)}}}}
		if after != "" {
			ops = append(ops, TxnOp{Type: OpKVCheckValue, Key: "ptr", Value: []byte(after)})
		}
		ops = append(ops, TxnOp{Type: OpKVPut, Key: "ptr", Value: []byte(value)})
		r, ok := h.apply(&Txn{Tenant: "default", Ops: ops})[0].(*TxnResult)
		if !ok {
			t.Fatal("not a transaction result")
		}
		return r
	}
	if r := txn("a", "", `{"n":1}`); r.Err != nil {
		t.Fatalf("first write: %v", r.Err)
	}
	// The value it names is there: committed, with the key's version.
	r := txn("b", `{"n":1}`, `{"n":2}`)
	if r.Err != nil {
		t.Fatalf("write after {n:1}: %v", r.Err)
	}
	if r.Results[1].Version == 0 {
		t.Fatalf("kv.checkValue reports version 0 for a key that exists")
	}
	// Conditioned on a write that never happened ({n:3}): refused.
	r = txn("c", `{"n":3}`, `{"n":4}`)
	if r.Err == nil || r.Err.Code != "condition_failed" || r.FailedOp != 1 {
		t.Fatalf("write after a missing value: %+v", r)
	}
	if r.CurrentVersion == 0 {
		t.Fatal("a refused kv.checkValue names no current version")
	}
	// An older value (ABA is the caller's to avoid; here it is simply not
	// current) and a prefix of the current one are refused too.
	for _, after := range []string{`{"n":1}`, `{"n":`} {
		if r := txn("c", after, `{"n":5}`); r.Err == nil {
			t.Fatalf("write after %s committed while the key holds {\"n\":2}", after)
		}
	}
	// Refused transactions wrote none of their messages.
	rd := h.s.Reader()
	defer rd.Close()
	parts, ok := rd.Partitions("default", "q", 0, 10, h.now)
	if !ok || len(parts) != 2 {
		t.Fatalf("partitions after two committed writes: %+v", parts)
	}
	// An absent key holds no value.
	r, _ = h.apply(&Txn{Tenant: "default", Ops: []TxnOp{{Type: OpKVCheckValue, Key: "none", Value: []byte(`1`)}}})[0].(*TxnResult)
	if r == nil || r.Err == nil || r.Err.Code != "condition_failed" {
		t.Fatalf("kv.checkValue of an absent key: %+v", r)
	}
	// A transaction holding the condition is logged under its own kind, so
	// that a build that does not know it stops rather than refuse what
	// the others apply; one without it keeps the old kind.
	checked := &Txn{Tenant: "t", Ops: []TxnOp{{Type: OpKVCheckValue, Key: "k", Value: []byte(`"v"`)}}}
	plain := &Txn{Tenant: "t", Ops: []TxnOp{{Type: OpKVPut, Key: "k", Value: []byte(`"v"`)}}}
	if checked.kind() != kindTxnChecked || plain.kind() != kindTxn {
		t.Fatalf("kinds %d and %d, want %d and %d", checked.kind(), plain.kind(), kindTxnChecked, kindTxn)
	}
	data, err := EncodeEntry(&Entry{Cmds: []Command{checked}})
	if err != nil {
		t.Fatal(err)
	}
	en, err := DecodeEntry(data)
	if err != nil || len(en.Cmds) != 1 {
		t.Fatalf("entry with a checked transaction: %v", err)
	}
	if c, ok := en.Cmds[0].(*Txn); !ok || c.Ops[0].Type != OpKVCheckValue {
		t.Fatalf("decoded %+v", en.Cmds[0])
	}
	// The condition survives the log's encoding.
	c, err := decodeTxn(encodeTxn(&Txn{Tenant: "t", Ops: []TxnOp{{Type: OpKVCheckValue, Key: "k", Value: []byte(`"v"`)}}}))
	if err != nil || c.Ops[0].Type != OpKVCheckValue || string(c.Ops[0].Value) != `"v"` {
		t.Fatalf("kv.checkValue does not round-trip: %+v, %v", c, err)
	}
}
