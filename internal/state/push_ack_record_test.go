package state

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"testing"

	"github.com/google/uuid"
)

// A push's and an ack's records, rebuilt with their commands, are their
// results, field for field: pushes with repeats inside the request and of
// stored messages, over several partitions and queues, refused pushes;
// acks by transaction id and by offset (the id looked up), runs, failures,
// dead letters, unknown messages, stale leases. Random trials log their
// seed.
func TestPushAndAckRecordsRestoreTheResults(t *testing.T) {
	var seen struct{ dup, dlq, looked, failed, released int }
	defer func() {
		if seen.dup == 0 || seen.dlq == 0 || seen.looked == 0 || seen.failed == 0 || seen.released == 0 {
			t.Errorf("the trials missed a case: %+v", seen)
		}
	}()
	for seed := int64(1); seed <= 12; seed++ {
		rng := rand.New(rand.NewSource(seed))
		h := newHarness(t)
		if r := h.apply(&Configure{Tenant: "default", Queue: "dlq", Options: map[string]json.RawMessage{"retryLimit": json.RawMessage("0")}})[0].(*ConfigureResult); r.Err != nil {
			t.Fatalf("configure: %v", r.Err)
		}
		var stored []PushItem
		for round := 0; round < 6; round++ {
			push := &Push{Tenant: "default"}
			for i, n := 0, 1+rng.Intn(60); i < n; i++ {
				it := PushItem{Queue: []string{"a", "b", "dlq"}[rng.Intn(3)], Partition: fmt.Sprintf("p%d", rng.Intn(4)), TxID: uuid.NewString(), Payload: []byte(`{"v":1}`)}
				switch k := rng.Intn(10); {
				case k == 0 && len(stored) > 0: // a repeat of a stored message
					it = stored[rng.Intn(len(stored))]
				case k == 1 && len(push.Items) > 0: // a repeat inside the request
					it = push.Items[rng.Intn(len(push.Items))]
				}
				push.Items = append(push.Items, it)
			}
			pr := h.apply(push)[0].(*PushResult)
			checkPushRecord(t, seed, push, pr)
			for _, it := range pr.Items {
				if it.Duplicate {
					seen.dup++
				}
			}
			stored = append(stored, push.Items...)
		}
		if r := h.apply(&Configure{Tenant: "default", Queue: "full", Options: map[string]json.RawMessage{"maxSize": json.RawMessage("1")}})[0].(*ConfigureResult); r.Err != nil {
			t.Fatalf("configure: %v", r.Err)
		}
		bad := &Push{Tenant: "default"}
		for i := 0; i < 3; i++ {
			bad.Items = append(bad.Items, PushItem{Queue: "full", Partition: "p", TxID: uuid.NewString(), Payload: []byte(`1`)})
		}
		if r := h.apply(bad)[0].(*PushResult); r.Err == nil {
			t.Fatalf("seed %d: a push over the queue's maxSize was taken", seed)
		} else {
			checkPushRecord(t, seed, bad, r)
		}

		for _, q := range []string{"a", "b", "dlq"} {
			pop := h.pop(Pop{Queue: q, Group: "g", SubMode: "all", Batch: 1000, Partitions: 10, LeaseSeconds: 60})
			if len(pop.Messages) == 0 {
				t.Fatalf("seed %d: nothing popped from %s", seed, q)
			}
			ack := &Ack{Tenant: "default"}
			for i := 0; i < len(pop.Messages); i++ {
				m := pop.Messages[i]
				it := AckItem{PartitionID: m.PartitionID, Status: []string{AckCompleted, AckCompleted, AckFailed, AckDLQ}[rng.Intn(4)], Group: "g", LeaseID: pop.LeaseID}
				off := m.Offset
				switch k := rng.Intn(8); {
				case k < 3:
					it.TxID = m.TxID
				case k < 5:
					it.Offset = &off // the apply looks the id up
				case k == 5:
					it.Offset, it.TxIDKnown = &off, true
				case k == 6:
					// A run of the partition's next offsets, when they follow.
					n := 1
					for i+n < len(pop.Messages) && pop.Messages[i+n].PartitionID == m.PartitionID && pop.Messages[i+n].Offset == off+uint64(n) && n < 5 {
						n++
					}
					it.Offset, it.Count, it.Status = &off, uint64(n), AckCompleted
					i += n - 1
				default:
					it.TxID = uuid.NewString() // no such message
				}
				if rng.Intn(12) == 0 {
					it.LeaseID = uuid.NewString() // not the lease
				}
				ack.Items = append(ack.Items, it)
			}
			r := h.ack(ack.Items...)
			checkAckRecord(t, seed, ack, r)
			for _, it := range r.Items {
				seen.dlq += b2i(it.DLQ)
				seen.looked += b2i(it.lookedUp)
				seen.failed += b2i(it.Error != "")
				seen.released += b2i(it.LeaseReleased)
			}
		}
	}
}

func checkPushRecord(t *testing.T, seed int64, c *Push, r *PushResult) {
	t.Helper()
	rec := r.Record()
	got, ok := rec.Result(c)
	if !ok || !reflect.DeepEqual(got, r) {
		t.Fatalf("seed %d: push record rebuilt %+v (%v), want %+v", seed, got, ok, r)
	}
	// At worst a run per item (items of random partitions); a push of many
	// items into a partition is one run.
	if len(r.Items) >= 20 && rec.Size() > 40*len(r.Items) {
		t.Fatalf("seed %d: the record of %d items keeps %d bytes", seed, len(r.Items), rec.Size())
	}
	if len(c.Items) > 0 {
		other := &Push{Items: c.Items[1:]}
		if _, ok := rec.Result(other); ok && r.Items != nil {
			t.Fatalf("seed %d: a push of another length was taken for the recorded one", seed)
		}
	}
}

func checkAckRecord(t *testing.T, seed int64, c *Ack, r *AckResult) {
	t.Helper()
	rec := r.Record()
	got, ok := rec.Result(c)
	if !ok || !reflect.DeepEqual(got, r) {
		t.Fatalf("seed %d: ack record rebuilt %+v (%v), want %+v", seed, got, ok, r)
	}
	looked, failed := 0, 0
	for _, it := range r.Items {
		if it.lookedUp {
			looked++
		}
		if it.Error != "" {
			failed++
		}
	}
	if len(r.Items) >= 20 && rec.Size() > 64*len(r.Items) {
		t.Fatalf("seed %d: the record of %d items (%d ids looked up, %d failed) keeps %d bytes", seed, len(r.Items), looked, failed, rec.Size())
	}
	t.Logf("seed %d: ack of %d items, %d ids looked up, %d failed: record %d bytes", seed, len(r.Items), looked, failed, rec.Size())
}

// A push of many messages into one partition, and their ack, are records
// of a few dozen bytes (their results are kilobytes).
func TestPushAndAckRecordsAreSmall(t *testing.T) {
	h := newHarness(t)
	push := &Push{Tenant: "default"}
	for i := 0; i < 100; i++ {
		push.Items = append(push.Items, PushItem{Queue: "q", Partition: "p", TxID: uuid.NewString(), Payload: []byte(`1`)})
	}
	pr := h.apply(push)[0].(*PushResult)
	checkPushRecord(t, 0, push, pr)
	if n := pr.Record().Size(); n > 128 {
		t.Fatalf("the record of a push of 100 into one partition keeps %d bytes", n)
	}
	pop := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 1, LeaseSeconds: 60})
	ack := &Ack{Tenant: "default"}
	for _, m := range pop.Messages {
		ack.Items = append(ack.Items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: pop.LeaseID})
	}
	ar := h.ack(ack.Items...)
	checkAckRecord(t, 0, ack, ar)
	if n := ar.Record().Size(); n > 256 {
		t.Fatalf("the record of an ack of 100 by transaction id keeps %d bytes", n)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
