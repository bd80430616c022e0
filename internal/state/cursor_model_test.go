package state

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"testing"

	"github.com/google/uuid"
)

// msgModel is what a group has done with one message, as the API defines
// it: deliveries (less the retries handed back), failed acks, finished.
type msgModel struct {
	attempt, retries uint32
	done             bool
}

// TestCursorRunsRandom applies random pops, partial acks in any order and
// status (completed, failed, retry, dlq), lease lapses and retry delays to
// two stores: one that keeps its cursors cached, and one that reopens after
// most operations (every cursor read back from its record, runs and all),
// sometimes with its cursors rewritten as version 1 and its subscriptions
// as JSON first. Both must give the same replies and store the same state,
// and every delivery must agree with a model of the messages: its attempt
// and retry counts (which go back only by a retry ack), never a finished
// message. QUEEN_TEST_TRACE=1 logs every operation.
func TestCursorRunsRandom(t *testing.T) {
	seed := rand.Int63()
	if v, err := strconv.ParseInt(os.Getenv("QUEEN_TEST_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (QUEEN_TEST_SEED replays it)", seed)
	rng := rand.New(rand.NewSource(seed))
	a, b := newHarness(t), newHarness(t)
	both := func(f func(h *harness) any) (any, any) { return f(a), f(b) }
	both(func(h *harness) any {
		h.configure("q", map[string]string{"retryDelay": "500", "retryLimit": "3"})
		return nil
	})
	type key struct {
		part string
		off  uint64
	}
	model := map[key]*msgModel{}
	pushed := map[string]uint64{}
	type held struct {
		pid  uint64
		part string
		off  uint64
	}
	var lease string
	var leased []held // the deliveries of the current lease not yet acked
	ops := 300
	if testing.Short() {
		ops = 100
	}
	for op := 0; op < ops; op++ {
		kind := rng.Intn(10)
		switch r := kind; {
		case r < 2: // push
			part := fmt.Sprintf("p%d", rng.Intn(3))
			n := 1 + rng.Intn(40)
			both(func(h *harness) any {
				c := &Push{Tenant: "default"}
				for i := 0; i < n; i++ {
					c.Items = append(c.Items, PushItem{Queue: "q", Partition: part, TxID: fmt.Sprintf("%s-%d", part, pushed[part]+uint64(i)), Payload: []byte(`1`)})
				}
				return h.apply(c)

			})
			for i := 0; i < n; i++ {
				model[key{part, pushed[part]}] = &msgModel{}
				pushed[part]++
			}
		case r < 5: // pop under a new lease
			id := uuid.NewString()
			c := Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1 + rng.Intn(60), Partitions: 1 + rng.Intn(3), LeaseSeconds: 30, LeaseID: id}
			ra, rb := both(func(h *harness) any { return h.pop(c) })
			pa, pb := ra.(*PopResult), rb.(*PopResult)
			if os.Getenv("QUEEN_TEST_TRACE") != "" {
				t.Logf("op %d pop %+v: a %v b %v", op, c, offsDesc(pa), offsDesc(pb))
			}
			if len(pa.Messages) != len(pb.Messages) {
				t.Fatalf("op %d: pop gave %d messages, %d after reopening", op, len(pa.Messages), len(pb.Messages))
			}
			if len(pa.Messages) > 0 {
				lease, leased = id, nil
			}
			for i, m := range pa.Messages {
				n := pb.Messages[i]
				if m.PartitionID != n.PartitionID || m.Offset != n.Offset || m.Attempt != n.Attempt || m.Retries != n.Retries {
					t.Fatalf("op %d: delivery %d is %s@%d attempt %d retries %d, after reopening %s@%d attempt %d retries %d",
						op, i, m.Partition, m.Offset, m.Attempt, m.Retries, n.Partition, n.Offset, n.Attempt, n.Retries)
				}
				x := model[key{m.Partition, m.Offset}]
				if x == nil || x.done {
					t.Fatalf("op %d: delivered %s@%d, finished or never pushed", op, m.Partition, m.Offset)
				}
				x.attempt++
				if m.Attempt != x.attempt || m.Retries != x.retries {
					t.Fatalf("op %d: %s@%d delivered with attempt %d retries %d, want %d and %d", op, m.Partition, m.Offset, m.Attempt, m.Retries, x.attempt, x.retries)
				}
				leased = append(leased, held{m.PartitionID, m.Partition, m.Offset})
			}
		case r < 8: // ack some of the lease's deliveries, in any order
			if len(leased) == 0 {
				continue
			}
			rng.Shuffle(len(leased), func(i, j int) { leased[i], leased[j] = leased[j], leased[i] })
			k := 1 + rng.Intn(len(leased))
			var items []AckItem
			statuses := make([]string, k)
			for i, d := range leased[:k] {
				st := AckCompleted
				switch rng.Intn(8) {
				case 0:
					st = AckFailed
				case 1:
					st = AckRetry
				case 2:
					if rng.Intn(3) == 0 {
						st = AckDLQ
					}
				}
				statuses[i] = st
				off := d.off
				items = append(items, AckItem{PartitionID: d.pid, Offset: &off, TxIDKnown: true, Status: st, Group: "g", LeaseID: lease})
			}
			ra, rb := both(func(h *harness) any { return h.ack(items...) })
			xa, xb := ra.(*AckResult), rb.(*AckResult)
			if os.Getenv("QUEEN_TEST_TRACE") != "" {
				for i := range items {
					t.Logf("  ack %d %s: %+v / %+v", *items[i].Offset, statuses[i], xa.Items[i], xb.Items[i])
				}
			}
			for i, d := range leased[:k] {
				ia, ib := xa.Items[i], xb.Items[i]
				if ia.Success != ib.Success || ia.Error != ib.Error || ia.DLQ != ib.DLQ || ia.LeaseReleased != ib.LeaseReleased {
					t.Fatalf("op %d: ack of %s@%d: %+v, after reopening %+v", op, d.part, d.off, ia, ib)
				}
				x := model[key{d.part, d.off}]
				if !ia.Success || x.done {
					continue // the lease lapsed (a tick below), or finished before
				}
				switch statuses[i] {
				case AckCompleted:
					x.done = true
				case AckFailed:
					x.retries++
					if x.retries > 3 {
						x.done = true
						if !ia.DLQ {
							t.Fatalf("op %d: %s@%d failed %d times, not dead-lettered", op, d.part, d.off, x.retries)
						}
					}
				case AckRetry:
					if x.attempt > 0 {
						x.attempt--
					}
				case AckDLQ:
					x.done = true
				}
			}
			leased = leased[k:]
		case r < 9: // the lease lapses
			both(func(h *harness) any {
				h.now += 31e6
				return h.apply(&Tick{})
			})
			leased = nil
		default: // time passes (retry delays end)
			dt := int64(rng.Intn(1000)) * 1000
			both(func(h *harness) any {
				h.now += dt
				return h.apply(&Tick{})
			})
		}
		if os.Getenv("QUEEN_TEST_TRACE") != "" {
			t.Logf("op %d kind %d now %d", op, kind, a.now)
		}
		if diffStores(t, a, b) {
			t.Fatalf("op %d (kind %d): the stores differ after reopening", op, kind)
		}
		if rng.Intn(4) > 0 {
			if rng.Intn(4) == 0 {
				rewriteCursorsV1(t, b)
			}
			if rng.Intn(4) == 0 {
				rewriteSubsJSON(t, b)
			}
			b.reopen()
		}
	}
}

// offsDesc lists a pop's deliveries as partition@offset/attempt.
func offsDesc(r *PopResult) string {
	s := ""
	for _, m := range r.Messages {
		s += fmt.Sprintf("%s@%d/%d ", m.Partition, m.Offset, m.Attempt)
	}
	return s
}

// diffStores logs the keys whose values differ between two stores, and
// reports whether there are any. Cursor and subscription records compare
// decoded: one store may hold them in the older encodings.
func diffStores(t *testing.T, a, b *harness) bool {
	t.Helper()
	ma, mb := logicalDump(t, a), logicalDump(t, b)
	differ := false
	for k, v := range ma {
		if w, ok := mb[k]; !ok || w != v {
			t.Logf("key %x: %x / %x (%v)", k, v, w, ok)
			differ = true
		}
	}
	for k, w := range mb {
		if _, ok := ma[k]; !ok {
			t.Logf("key %x only after reopening: %x", k, w)
			differ = true
		}
	}
	return differ
}
