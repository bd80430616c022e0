package state

import "testing"

// Only entries made of leasing pops are lease-only: an autoAck pop is an
// ack, and every other command changes what must survive a power loss.
func TestLeaseOnly(t *testing.T) {
	part := "p1"
	lease := &Pop{Tenant: "default", Queue: "q", Group: "g", Batch: 10, LeaseID: "8d1c1b5e-4a4f-4b6a-9d55-6f2b7a0c1e01"}
	leaseP := &Pop{Tenant: "default", Queue: "q", Partition: &part, Batch: 1, LeaseSeconds: 30, LeaseID: "8d1c1b5e-4a4f-4b6a-9d55-6f2b7a0c1e02"}
	auto := &Pop{Tenant: "default", Queue: "q", Batch: 1, AutoAck: true}
	push := &Push{Tenant: "default", Items: []PushItem{{Queue: "q", Partition: "p", TxID: "t", Payload: []byte(`1`)}}}
	ack := &Ack{Tenant: "default", Items: []AckItem{{PartitionID: 1, TxID: "t", Status: AckCompleted}}}
	for _, c := range []struct {
		name string
		cmds []Command
		want bool
	}{
		{"one leasing pop", []Command{lease}, true},
		{"leasing pops", []Command{lease, leaseP, lease}, true},
		{"autoAck pop", []Command{auto}, false},
		{"leasing and autoAck pops", []Command{lease, auto}, false},
		{"pop and push", []Command{lease, push}, false},
		{"ack and pop", []Command{ack, lease}, false},
		{"extend", []Command{&ExtendLease{Tenant: "default", LeaseID: "x"}}, false},
		{"tick", []Command{&Tick{}}, false},
		{"empty", nil, false},
	} {
		b, err := EncodeEntry(&Entry{Time: 1, Cmds: c.cmds})
		if err != nil {
			t.Fatal(err)
		}
		if got := LeaseOnly(b); got != c.want {
			t.Errorf("%s: LeaseOnly = %v, want %v", c.name, got, c.want)
		}
		// Every cut of the entry is unreadable, so not lease-only.
		for i := 0; i < len(b); i++ {
			if LeaseOnly(b[:i]) {
				t.Fatalf("%s: LeaseOnly of the entry cut at %d of %d = true", c.name, i, len(b))
			}
		}
	}
	if LeaseOnly(nil) || LeaseOnly([]byte("{\"json\":1}")) {
		t.Error("LeaseOnly of junk = true")
	}
}
