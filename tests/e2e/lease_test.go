package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLeaseExclusiveConcurrentConsumers runs 8 consumers of one group over 20
// partitions and checks that no partition is ever held by two consumers at
// once, that every message is processed exactly once, and that each
// partition's offsets are processed in increasing order.
//
// A consumer "holds" a partition from the moment it has the pop reply until
// the moment it sends the ack. That interval lies inside the server's lease
// (granted before the reply was sent, released no earlier than the ack was
// received), so two such intervals overlapping proves the server leased one
// partition to two consumers; using "until the ack reply" instead would
// report false overlaps (the next consumer may get the partition before the
// first one has read its ack reply).
func TestLeaseExclusiveConcurrentConsumers(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	const (
		q          = "lease-conc"
		group      = "workers"
		partitions = 20
		perPart    = 150
		total      = partitions * perPart
		workers    = 8
	)
	type pushed struct {
		part string
		k    int
	}
	byID := map[string]pushed{}
	for start := 0; start < total; start += 500 {
		items := make([]pushItem, 0, 500)
		for k := start; k < start+500; k++ {
			items = append(items, pushItem{Queue: q, Partition: fmt.Sprintf("p%02d", k%partitions), Payload: M{"i": k}})
		}
		for _, r := range s.push(t, items) {
			if r.Status != "queued" {
				t.Fatalf("push: %+v", r)
			}
			k := start + r.Index
			byID[r.MessageID] = pushed{part: fmt.Sprintf("p%02d", k%partitions), k: k}
		}
	}
	if len(byID) != total {
		t.Fatalf("push gave %d distinct message ids, want %d", len(byID), total)
	}

	var (
		mu         sync.Mutex
		holder     = map[string]string{} // partitionId → lease holding it
		lastOffset = map[string]int64{}  // partitionId → last processed offset
		seen       = map[string]int{}    // message id → times processed
		errs       []string
		processed  atomic.Int64
		pops       atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) < 30 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for processed.Load() < total && time.Now().Before(deadline) {
				path := popPath(q, fmt.Sprintf("consumerGroup=%s&subscriptionMode=all&batch=%d&partitions=%d&wait=true&timeout=200",
					group, 5+rng.IntN(30), 1+rng.IntN(3)))
				p, _, err := s.tryPop(path)
				if err != nil {
					fail("worker %d: %v", w, err)
					return
				}
				if p == nil {
					continue
				}
				pops.Add(1)
				parts := map[string]bool{}
				mu.Lock()
				for _, m := range p.Messages {
					if !parts[m.PartitionID] {
						parts[m.PartitionID] = true
						if h, ok := holder[m.PartitionID]; ok {
							errs = append(errs, fmt.Sprintf("partition %s (%s) handed to worker %d (lease %s) while lease %s still holds it",
								m.PartitionID, m.Partition, w, p.LeaseID, h))
						}
						holder[m.PartitionID] = p.LeaseID
					}
					if m.LeaseID != p.LeaseID || m.ConsumerGroup != group {
						errs = append(errs, fmt.Sprintf("message %s: leaseId %q group %q in a reply with lease %q", m.ID, m.LeaseID, m.ConsumerGroup, p.LeaseID))
					}
					want, ok := byID[m.ID]
					var d struct{ I int }
					json.Unmarshal(m.Data, &d)
					if !ok || want.part != m.Partition || want.k != d.I {
						errs = append(errs, fmt.Sprintf("message %s: partition %q data %s does not match what was pushed (%+v)", m.ID, m.Partition, m.Data, want))
					}
					seen[m.ID]++
					if seen[m.ID] > 1 {
						errs = append(errs, fmt.Sprintf("message %s (partition %s offset %d) processed %d times", m.ID, m.Partition, m.Offset, seen[m.ID]))
					}
					if l, ok := lastOffset[m.PartitionID]; ok && m.Offset <= l {
						errs = append(errs, fmt.Sprintf("partition %s: offset %d processed after offset %d", m.Partition, m.Offset, l))
					}
					lastOffset[m.PartitionID] = m.Offset
				}
				mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond) // "work"
				mu.Lock()
				for pid := range parts {
					if holder[pid] == p.LeaseID {
						delete(holder, pid)
					}
				}
				mu.Unlock()
				acks := make([]ackReq, len(p.Messages))
				for i, m := range p.Messages {
					acks[i] = ackFor(m, "completed")
				}
				r, err := s.roundTrip("POST", "/api/v1/ack/batch", ackBatchBody(group, acks))
				if err != nil {
					fail("worker %d: %v", w, err)
					return
				}
				var res []ackResult
				if r.Status != http.StatusOK || json.Unmarshal(r.Body, &res) != nil || len(res) != len(acks) {
					fail("worker %d: ack/batch:\n%s", w, r)
					return
				}
				for i, a := range res {
					if !a.Success {
						fail("worker %d: ack of %s failed: %s", w, acks[i].TransactionID, a.errText())
					}
				}
				processed.Add(int64(len(p.Messages)))
			}
		}(w)
	}
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	if len(seen) != total {
		t.Errorf("processed %d distinct messages, want %d (in %d pops)", len(seen), total, pops.Load())
	}
	if len(lastOffset) != partitions {
		t.Errorf("saw %d partitions, want %d", len(lastOffset), partitions)
	}
	t.Logf("%d messages over %d partitions in %d pops by %d consumers", len(seen), len(lastOffset), pops.Load(), workers)
	s.mustEmpty(t, q, "consumerGroup="+group+"&batch=100&partitions=100")
}

// TestLeaseExpiry covers lease expiry, extension and autoAck over waits of a
// few seconds; the cases run side by side on one server.
func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	t.Run("UnackedRedelivered", func(t *testing.T) {
		t.Parallel()
		q := "lease-expiry"
		pushed := s.pushN(t, q, "p", 4)
		popSent := time.Now()
		p := s.mustPop(t, q, "batch=4&leaseSeconds=5", 4)
		for i, m := range p.Messages {
			if m.ID != pushed[i].MessageID || m.Attempt != 1 {
				t.Fatalf("first pop: message %d is %s attempt %d; want %s attempt 1", i, m.ID, m.Attempt, pushed[i].MessageID)
			}
		}
		for _, i := range []int{0, 2} {
			if r := s.mustAck(t, ackFor(p.Messages[i], "completed")); r.LeaseReleased {
				t.Errorf("ack of message %d of 4 released the lease", i)
			}
		}
		time.Sleep(3 * time.Second)
		s.mustEmpty(t, q, "batch=10") // still leased
		var again *popReply
		err := checkFor(12*time.Second, 100*time.Millisecond, func() error {
			again = s.pop(t, q, "batch=10")
			if again == nil {
				return fmt.Errorf("not redelivered %v after the pop", time.Since(popSent).Round(time.Millisecond))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if el := time.Since(popSent); el < 4900*time.Millisecond {
			t.Errorf("redelivered %v after a pop with leaseSeconds=5", el)
		}
		if len(again.Messages) != 2 {
			t.Fatalf("redelivery: want the 2 unacknowledged messages (offsets %d, %d), got offsets %v",
				p.Messages[1].Offset, p.Messages[3].Offset, offsets(again.Messages))
		}
		for j, i := range []int{1, 3} {
			m, o := again.Messages[j], p.Messages[i]
			if m.ID != o.ID || m.Offset != o.Offset || m.TransactionID != o.TransactionID || m.PartitionID != o.PartitionID || string(m.Data) != string(o.Data) {
				t.Errorf("redelivered %+v, want the same message as %+v", m, o)
			}
			if m.Attempt != 2 {
				t.Errorf("redelivered message %d: attempt %d, want 2", i, m.Attempt)
			}
			if m.LeaseID == o.LeaseID {
				t.Errorf("redelivery reuses the expired lease id %s", o.LeaseID)
			}
		}
		// The expired lease no longer acknowledges anything.
		if r := s.ack(t, ackFor(p.Messages[1], "completed")); r.Success || r.errText() != "lease_expired" {
			t.Errorf("ack under the expired lease: want success false, lease_expired; got %+v (%s)", r, r.errText())
		}
		s.ackAll(t, again, "completed")
		s.mustEmpty(t, q, "batch=10")
	})

	t.Run("Extend", func(t *testing.T) {
		t.Parallel()
		q := "lease-extend"
		s.pushN(t, q, "p", 1)
		p := s.mustPop(t, q, "leaseSeconds=5", 1)
		var out []struct {
			LeaseID   string `json:"leaseId"`
			Success   bool   `json:"success"`
			ExpiresAt string `json:"expiresAt"`
			Error     string `json:"error"`
		}
		r := s.callJSON(t, "POST", "/api/v1/lease/"+p.LeaseID+"/extend", M{"seconds": 30}, 200, &out)
		if len(out) != 1 || !out[0].Success || out[0].LeaseID != p.LeaseID {
			t.Fatalf("extend: want one success entry for lease %s:\n%s", p.LeaseID, r)
		}
		exp := parseAPITime(t, "expiresAt", out[0].ExpiresAt)
		if d := time.Until(exp); d < 25*time.Second || d > 35*time.Second {
			t.Errorf("extend by 30 s: expiresAt %s is %v from now", out[0].ExpiresAt, d.Round(time.Millisecond))
		}
		// No seconds: the queue's leaseTime (300 s by default).
		out = nil
		r = s.callJSON(t, "POST", "/api/v1/lease/"+p.LeaseID+"/extend", M{}, 200, &out)
		if len(out) != 1 || !out[0].Success {
			t.Fatalf("extend with no seconds:\n%s", r)
		}
		if d := time.Until(parseAPITime(t, "expiresAt", out[0].ExpiresAt)); d < 290*time.Second || d > 310*time.Second {
			t.Errorf("extend with no seconds: expiresAt %s is %v from now, want the leaseTime 300 s", out[0].ExpiresAt, d.Round(time.Second))
		}
		time.Sleep(6 * time.Second)
		s.mustEmpty(t, q, "") // the extended lease still holds it
		if a := s.ack(t, ackFor(p.Messages[0], "completed")); !a.Success || !a.LeaseReleased {
			t.Errorf("ack under the extended lease after 6 s: %+v (%s)", a, a.errText())
		}
		s.mustEmpty(t, q, "")
	})

	t.Run("ExtendUnknownLease", func(t *testing.T) {
		t.Parallel()
		var out []struct {
			LeaseID string `json:"leaseId"`
			Success bool   `json:"success"`
			Error   string `json:"error"`
		}
		for _, id := range []string{"no-such-lease", "0190b6a0-0000-7000-8000-000000000000"} {
			out = nil
			r := s.callJSON(t, "POST", "/api/v1/lease/"+id+"/extend", M{"seconds": 30}, 200, &out)
			if len(out) != 1 || out[0].Success || out[0].Error != "lease_not_found" {
				t.Errorf("extend of an unknown lease: want success false, error lease_not_found:\n%s", r)
			}
		}
	})

	t.Run("ExtendedAfterExpiry", func(t *testing.T) {
		t.Parallel()
		q := "lease-extend-late"
		s.pushN(t, q, "p", 1)
		p := s.mustPop(t, q, "leaseSeconds=5", 1)
		time.Sleep(6 * time.Second)
		var out []struct {
			Success bool   `json:"success"`
			Error   string `json:"error"`
		}
		r := s.callJSON(t, "POST", "/api/v1/lease/"+p.LeaseID+"/extend", M{"seconds": 30}, 200, &out)
		if len(out) != 1 || out[0].Success || (out[0].Error != "lease_expired" && out[0].Error != "lease_not_found") {
			t.Errorf("extend of an expired lease: want success false, lease_expired or lease_not_found:\n%s", r)
		}
		m := s.mustPop(t, q, "", 1).Messages[0]
		if m.ID != p.Messages[0].ID || m.Attempt != 2 {
			t.Errorf("after expiry: got %s attempt %d, want %s attempt 2", m.ID, m.Attempt, p.Messages[0].ID)
		}
	})

	t.Run("AutoAckNotRedelivered", func(t *testing.T) {
		t.Parallel()
		q := "lease-autoack"
		s.pushN(t, q, "p", 2)
		p := s.mustPop(t, q, "batch=10&autoAck=true&leaseSeconds=5", 2)
		if p.LeaseID != "" {
			t.Errorf("autoAck leaseId %q, want \"\"", p.LeaseID)
		}
		s.mustEmpty(t, q, "batch=10")
		time.Sleep(6 * time.Second)
		s.mustEmpty(t, q, "batch=10")
		if qi, raw := s.queueInfo(t, q); qi.Messages.Pending != 0 {
			t.Errorf("autoAck'd messages still pending: %v", raw["messages"])
		}
	})

	t.Run("ReleasedLeaseFreesPartition", func(t *testing.T) {
		t.Parallel()
		q := "lease-release"
		s.pushN(t, q, "p", 3)
		p := s.mustPop(t, q, "batch=2&leaseSeconds=3600", 2)
		s.mustEmpty(t, q, "")
		s.ackAll(t, p, "completed")
		m := s.mustPop(t, q, "", 1).Messages[0]
		if !strings.Contains(string(m.Data), "2") {
			t.Errorf("after releasing the lease: got %s, want message 2", m.Data)
		}
	})
}
