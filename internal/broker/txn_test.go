package broker

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// TestKVCompareAndSetCounter: many goroutines increment one counter with
// compare-and-set; the final value equals the number of successful writes
// and the versions each writer saw strictly increase.
func TestKVCompareAndSetCounter(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	zero := uint64(0)
	if _, err := b.KVPut(ctx, "default", "counter", []byte(`0`), &zero, 0, false); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var versions []uint64
	successes := 0
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				e, ok, err := b.KVGet(ctx, "default", "counter")
				if err != nil || !ok {
					t.Errorf("get: %v %v", ok, err)
					return
				}
				n, _ := strconv.Atoi(string(e.Value))
				v := e.Version
				nv, err := b.KVPut(ctx, "default", "counter", []byte(strconv.Itoa(n+1)), &v, 0, false)
				var be *Error
				switch {
				case err == nil:
					if nv <= v {
						t.Errorf("new version %d not above %d", nv, v)
					}
					mu.Lock()
					successes++
					versions = append(versions, nv)
					mu.Unlock()
				case errors.As(err, &be) && be.Code == "condition_failed":
					if be.CurrentVersion == nil || *be.CurrentVersion == v {
						t.Errorf("conflict without the current version: %+v", be)
					}
				default:
					t.Errorf("put: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	e, _, _ := b.KVGet(ctx, "default", "counter")
	if got, _ := strconv.Atoi(string(e.Value)); got != successes || successes == 0 {
		t.Fatalf("counter = %d, successful writes = %d", got, successes)
	}
	seen := map[uint64]bool{}
	for _, v := range versions {
		if seen[v] {
			t.Fatalf("version %d handed out twice", v)
		}
		seen[v] = true
	}
	// Versions are never reused, also after a delete.
	if _, err := b.KVDelete(ctx, "default", "counter", nil, false); err != nil {
		t.Fatal(err)
	}
	nv, err := b.KVPut(ctx, "default", "counter", []byte(`1`), &zero, 0, false)
	if err != nil || nv <= e.Version {
		t.Fatalf("version after delete+put = %d (err %v), want > %d", nv, err, e.Version)
	}
}

// TestTransactionAtomicity: a transaction whose last operation fails leaves
// queues, offsets, leases and KV exactly as before (full-state checksum).
func TestTransactionAtomicity(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	if _, err := b.Push(ctx, "default", []PushItem{{Queue: "tx", Partition: "a", Payload: []byte(`1`)}, {Queue: "tx", Partition: "a", Payload: []byte(`2`)}}); err != nil {
		t.Fatal(err)
	}
	pop, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "tx", Group: "g", SubscriptionMode: "all", Batch: 2})
	if err != nil || len(pop.Messages) != 2 {
		t.Fatalf("pop: %v %+v", err, pop)
	}
	if _, err := b.KVPut(ctx, "default", "k", []byte(`{"v":1}`), nil, 0, false); err != nil {
		t.Fatal(err)
	}
	before, err := b.Node().Store().Checksum()
	if err != nil {
		t.Fatal(err)
	}
	wrong := uint64(999999)
	m := pop.Messages[0]
	_, err = b.Transaction(ctx, TxnRequest{Tenant: "default", RequiredLeases: []string{pop.LeaseID}, Ops: []TxnOp{
		{Type: OpPush, Items: []PushItem{{Queue: "tx", Partition: "b", Payload: []byte(`3`)}, {Queue: "other", Partition: "x", Payload: []byte(`4`)}}},
		{Type: OpAck, Ack: AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: "g", LeaseID: pop.LeaseID}},
		{Type: OpKVPut, Key: "k", Value: []byte(`{"v":2}`)},
		{Type: OpKVDelete, Key: "k2"},
		{Type: OpKVCheck, Key: "k", IfVersion: &wrong},
	}})
	var be *Error
	if !errors.As(err, &be) || be.Code != "condition_failed" || be.Operation == nil || *be.Operation != 4 {
		t.Fatalf("want condition_failed on operation 4, got %v", err)
	}
	after, err := b.Node().Store().Checksum()
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Fatalf("a failed transaction changed state: %x -> %x", before, after)
	}
	// A refused ack fails the whole transaction too.
	_, err = b.Transaction(ctx, TxnRequest{Tenant: "default", Ops: []TxnOp{
		{Type: OpKVPut, Key: "k3", Value: []byte(`1`)},
		{Type: OpAck, Ack: AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: "g", LeaseID: "01a227cc-8d7e-7bd4-a13f-9d251241d4ae"}},
	}})
	if !errors.As(err, &be) || be.Operation == nil || *be.Operation != 1 {
		t.Fatalf("want the refused ack (operation 1) to fail the transaction, got %v", err)
	}
	if _, ok, _ := b.KVGet(ctx, "default", "k3"); ok {
		t.Fatal("k3 written by a failed transaction")
	}
	// The same transaction with a true condition commits everything, and a
	// retry of it is harmless: the push is a duplicate, the ack a no-op.
	v := uint64(0)
	e, _, _ := b.KVGet(ctx, "default", "k")
	v = e.Version
	ops := []TxnOp{
		{Type: OpPush, Items: []PushItem{{Queue: "tx", Partition: "b", Payload: []byte(`3`), TxID: "fixed-1"}}},
		{Type: OpAck, Ack: AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: "g", LeaseID: pop.LeaseID}},
		{Type: OpKVPut, Key: "k", Value: []byte(`{"v":2}`), IfVersion: &v},
	}
	out, err := b.Transaction(ctx, TxnRequest{Tenant: "default", Ops: ops})
	if err != nil || out[0].Push[0].Duplicate || !out[1].Ack.Success || out[2].Version <= v {
		t.Fatalf("commit: %v %+v", err, out)
	}
	ops[2].IfVersion = &out[2].Version
	out2, err := b.Transaction(ctx, TxnRequest{Tenant: "default", Ops: ops})
	if err != nil || !out2[0].Push[0].Duplicate || out2[0].Push[0].Offset != out[0].Push[0].Offset {
		t.Fatalf("retry: %v %+v", err, out2)
	}
}

// TestKVTTLAndReservedSpace: a TTL key disappears once its time passes; keys
// under __queen/ are readable but not writable by clients.
func TestKVTTLAndReservedSpace(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	if _, err := b.KVPut(ctx, "default", "lease/x", []byte(`"me"`), nil, 300, false); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := b.KVGet(ctx, "default", "lease/x"); !ok {
		t.Fatal("TTL key missing right after the write")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok, _ := b.KVGet(ctx, "default", "lease/x"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("TTL key still visible 5 s after a 300 ms TTL")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Removed in the background too, not only hidden.
	deadline = time.Now().Add(5 * time.Second)
	for b.Node().Store().Deadline() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	r := b.Node().Store().Reader()
	if l := r.KVList("default", "lease/", "", 10, 0); len(l) != 0 {
		t.Fatalf("expired key still stored: %+v", l)
	}
	r.Close()

	_, err := b.KVPut(ctx, "default", "__queen/connectors/x/pointer", []byte(`{}`), nil, 0, false)
	var be *Error
	if !errors.As(err, &be) || be.Code != "reserved_key" {
		t.Fatalf("client write under __queen/ = %v, want reserved_key", err)
	}
	if _, err := b.KVPut(ctx, "default", "__queen/connectors/x/pointer", []byte(`{"lsn":"0/1"}`), nil, 0, true); err != nil {
		t.Fatalf("internal write: %v", err)
	}
	e, ok, err := b.KVGet(ctx, "default", "__queen/connectors/x/pointer")
	var v map[string]string
	if err != nil || !ok || json.Unmarshal(e.Value, &v) != nil || v["lsn"] != "0/1" {
		t.Fatalf("read internal key: %v %v %s", ok, err, e.Value)
	}
}

// TestKVListPaging: prefix listing returns keys in order, page by page,
// without expired keys or keys of other prefixes.
func TestKVListPaging(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	for i := 0; i < 25; i++ {
		if _, err := b.KVPut(ctx, "default", "jobs/"+strconv.Itoa(100+i), []byte(strconv.Itoa(i)), nil, 0, false); err != nil {
			t.Fatal(err)
		}
	}
	b.KVPut(ctx, "default", "jobz", []byte(`0`), nil, 0, false)
	b.KVPut(ctx, "default", "jobs/zz-short", []byte(`0`), nil, 1, false)
	time.Sleep(20 * time.Millisecond)
	var got []string
	after := ""
	for page := 0; page < 10; page++ {
		l, err := b.KVList(ctx, "default", "jobs/", after, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l {
			got = append(got, e.Key)
		}
		if len(l) < 10 {
			break
		}
		after = l[len(l)-1].Key
	}
	if len(got) != 25 || got[0] != "jobs/100" || got[24] != "jobs/124" {
		t.Fatalf("paged listing = %d keys %v", len(got), got)
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("keys out of order at %d: %v", i, got)
		}
	}
	if _, err := b.KVList(ctx, "default", "", "", 0); err == nil {
		t.Fatal("limit 0 accepted")
	}
}

// TestTxnNoPushOutcomes: a transaction that leaves its push outcomes out
// still pushes every new message once, counts them per queue in the
// pushed metric (duplicates not), and returns the pointer write's version.
func TestTxnNoPushOutcomes(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	pushed := func(q string) float64 {
		var m dto.Metric
		if err := b.m.pushed.WithLabelValues("default", q).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	items := []PushItem{
		{Queue: "na", Partition: "1", TxID: "t1", Payload: []byte(`1`)},
		{Queue: "na", Partition: "2", TxID: "t2", Payload: []byte(`2`)},
		{Queue: "na", Partition: "1", TxID: "t1", Payload: []byte(`1`)}, // a duplicate
		{Queue: "nb", Partition: "1", TxID: "t3", Payload: []byte(`3`)},
	}
	zero := uint64(0)
	out, err := b.Transaction(ctx, TxnRequest{Tenant: "default", NoPushOutcomes: true, Ops: []TxnOp{
		{Type: OpPush, Items: items},
		{Type: OpKVPut, Key: "ptr", Value: []byte(`1`), IfVersion: &zero},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Push != nil || out[1].Version == 0 {
		t.Fatalf("outcomes %+v, want no push outcome and the put's version", out)
	}
	if a, c := pushed("na"), pushed("nb"); a != 2 || c != 1 {
		t.Fatalf("pushed metric na=%v nb=%v, want 2 and 1", a, c)
	}
	for q, want := range map[string]int{"na": 2, "nb": 1} {
		r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: q, Batch: 10, Partitions: 10, AutoAck: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Messages) != want {
			t.Fatalf("queue %s: %d messages, want %d", q, len(r.Messages), want)
		}
	}
}

// TestTxnCheckValue: kv.checkValue is for in-process callers only; it
// commits a transaction only while the key holds exactly the bytes named,
// and calls OnQueued's function once the transaction is queued.
func TestTxnCheckValue(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	if _, err := b.KVPut(ctx, "default", "k", []byte(`{"n":1}`), nil, 0, false); err != nil {
		t.Fatal(err)
	}
	check := func(v string) TxnOp { return TxnOp{Type: OpKVCheckValue, Key: "k", Value: []byte(v)} }
	put := TxnOp{Type: OpKVPut, Key: "k", Value: []byte(`{"n":2}`)}
	var be *Error
	_, err := b.Transaction(ctx, TxnRequest{Tenant: "default", Ops: []TxnOp{check(`{"n":1}`), put}})
	if !errors.As(err, &be) || be.Code != "invalid_parameter" || be.Field != "operations[0].type" {
		t.Fatalf("kv.checkValue from a client: %v, want invalid_parameter on operations[0].type", err)
	}
	_, err = b.Transaction(ctx, TxnRequest{Tenant: "default", Internal: true, Ops: []TxnOp{check(`{"n":9}`), put}})
	if !errors.As(err, &be) || be.Code != "condition_failed" {
		t.Fatalf("kv.checkValue of another value: %v, want condition_failed", err)
	}
	queued := false
	if _, err := b.Transaction(OnQueued(ctx, func() { queued = true }), TxnRequest{Tenant: "default", Internal: true, Ops: []TxnOp{check(`{"n":1}`), put}}); err != nil {
		t.Fatalf("kv.checkValue of the current value: %v", err)
	}
	if !queued {
		t.Fatal("OnQueued's function was not called")
	}
	if e, _, err := b.KVGet(ctx, "default", "k"); err != nil || string(e.Value) != `{"n":2}` {
		t.Fatalf("after the checked put: %s, %v", e.Value, err)
	}
}
