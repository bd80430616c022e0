package state

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

func (h *harness) configure(queue string, opts map[string]string) {
	h.t.Helper()
	o := map[string]json.RawMessage{}
	for k, v := range opts {
		o[k] = json.RawMessage(v)
	}
	r := h.apply(&Configure{Tenant: "default", Queue: queue, Options: o})[0].(*ConfigureResult)
	if r.Err != nil {
		h.t.Fatal(r.Err)
	}
}

func (h *harness) queueInfo(name string) QueueInfo {
	r := h.s.Reader()
	defer r.Close()
	qi, ok := r.Queue("default", name)
	if !ok {
		h.t.Fatalf("queue %s missing", name)
	}
	return qi
}

// countKeys counts live keys of one table. Messages and dedup keys share
// the message table; tMsg counts the messages, tDedup the dedup keys.
func (h *harness) countKeys(table byte) int {
	h.s.waitCommitted()
	lookIn := table
	if table == tDedup {
		lookIn = tMsg
	}
	it, err := h.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{lookIn}, UpperBound: []byte{lookIn + 1}})
	if err != nil {
		h.t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		if lookIn != tMsg || isDedupKey(it.Key()) == (table == tDedup) {
			n++
		}
	}
	return n
}

func TestRetentionByTime(t *testing.T) {
	h := newHarness(t)
	h.configure("r", map[string]string{"retentionSeconds": "60"})
	for i := 0; i < 3; i++ {
		h.push("r", fmt.Sprintf("p%d", i), `1`, `2`, `3`)
	}
	// A group consumes one message of p0; another has consumed nothing.
	pop := h.pop(Pop{Queue: "r", Group: "fast", SubMode: "all", Partition: ptr("p0"), Batch: 1, AutoAck: true})
	if len(pop.Messages) != 1 {
		t.Fatal("setup pop")
	}
	h.pop(Pop{Queue: "r", Group: "slow", SubMode: "all", Batch: 1, Partitions: 1, Partition: ptr("p9")})
	h.now += 30e6
	h.push("r", "p0", `4`) // younger: must survive
	h.now += 40e6          // the first 9 messages are now 70 s old
	for i := 0; i < 5; i++ {
		h.apply(&Tick{})
		h.now += 5e6
	}
	qi := h.queueInfo("r")
	if qi.Total != 1 || qi.Deleted != 9 {
		t.Fatalf("after retention total=%d deleted=%d, want 1 and 9", qi.Total, qi.Deleted)
	}
	if n := h.countKeys(tMsg); n != 1 {
		t.Fatalf("%d message keys remain, want 1", n)
	}
	// Consumers past the cut carry on with what is left.
	r := h.pop(Pop{Queue: "r", Group: "slow", Batch: 10, Partitions: 10, AutoAck: true})
	if len(r.Messages) != 1 || string(r.Messages[0].Payload) != "4" {
		t.Fatalf("slow group after retention got %+v", r.Messages)
	}
	rd := h.s.Reader()
	defer rd.Close()
	for _, g := range rd.Groups("default", "") {
		switch g.Group {
		case "slow":
			if g.Skipped != 9 || g.Pending != 0 {
				t.Fatalf("slow group skipped=%d pending=%d, want 9 and 0", g.Skipped, g.Pending)
			}
		case "fast":
			if g.Skipped != 8 {
				t.Fatalf("fast group skipped=%d, want 8", g.Skipped)
			}
		}
	}
	if h.s.Deadline() != 0 {
		// The remaining message is still indexed for its own bucket.
		t.Logf("next retention due at %s", time.UnixMicro(h.s.Deadline()).UTC())
	}
}

func ptr(s string) *string { return &s }

// TestRetentionDropsDedupByRange: once a partition's messages are gone, their
// dedup keys go too (by range), and the transaction id can be used again.
func TestRetentionDropsDedupByRange(t *testing.T) {
	h := newHarness(t)
	h.configure("d", map[string]string{"retentionMessages": "2"})
	push := func(tx string) *PushResult {
		return h.apply(&Push{Tenant: "default", Items: []PushItem{{Queue: "d", Partition: "p", TxID: tx, Payload: []byte(`1`)}}})[0].(*PushResult)
	}
	for i := 0; i < 10; i++ {
		if r := push(fmt.Sprintf("tx%d", i)); r.Items[0].Duplicate {
			t.Fatalf("tx%d reported duplicate", i)
		}
	}
	if qi := h.queueInfo("d"); qi.Total != 2 {
		t.Fatalf("retentionMessages=2 kept %d", qi.Total)
	}
	// Retained ones are still deduplicated.
	if r := push("tx9"); !r.Items[0].Duplicate {
		t.Fatal("tx9 is retained but not deduplicated")
	}
	// tx0's message is gone: its id is free again.
	if r := push("tx0"); r.Items[0].Duplicate {
		t.Fatal("tx0 was dropped by retention but still counts as a duplicate")
	}
	// Dedup keys are bounded by the retained messages, not the pushed ones.
	if n := h.countKeys(tDedup); n > 6 {
		t.Fatalf("%d dedup keys for 2 retained messages: dedup keys are not leaving with their messages", n)
	}
}

// TestRetentionWorkIndependentOfMessageCount: removing 10x more messages
// processes exactly as many retention index entries (one per partition and
// bucket), and each partition is cut with one range delete.
func TestRetentionWorkIndependentOfMessageCount(t *testing.T) {
	const partitions = 200
	work := map[int]int{}
	for _, perPart := range []int{5, 50} {
		h := newHarness(t)
		h.configure("big", map[string]string{"retentionSeconds": "10"})
		for p := 0; p < partitions; p++ {
			payloads := make([]string, perPart)
			for i := range payloads {
				payloads[i] = `{"x":1}`
			}
			h.push("big", fmt.Sprintf("p%04d", p), payloads...)
		}
		h.now += 20e6
		processed := 0
		for {
			r := h.apply(&Tick{})[0].(*CountResult)
			if r.Count == 0 {
				break
			}
			processed += r.Count
		}
		if qi := h.queueInfo("big"); qi.Total != 0 || qi.Deleted != int64(partitions*perPart) {
			t.Fatalf("perPart=%d: total=%d deleted=%d", perPart, qi.Total, qi.Deleted)
		}
		if n := h.countKeys(tMsg); n != 0 {
			t.Fatalf("perPart=%d: %d message keys left", perPart, n)
		}
		work[perPart] = processed
	}
	if work[5] != work[50] || work[5] != partitions {
		t.Fatalf("retention work %v: must be one entry per partition whatever the message count", work)
	}
}

func TestMaxSizeIsAtomic(t *testing.T) {
	h := newHarness(t)
	h.configure("m", map[string]string{"maxSize": "3"})
	h.push("m", "a", `1`, `2`)
	r := h.apply(&Push{Tenant: "default", Items: []PushItem{{Queue: "m", Partition: "a", TxID: "x", Payload: []byte(`3`)}, {Queue: "m", Partition: "new", TxID: "y", Payload: []byte(`4`)}}})[0].(*PushResult)
	if r.Err == nil || r.Err.Code != "queue_full" {
		t.Fatalf("push over maxSize = %+v", r)
	}
	qi := h.queueInfo("m")
	if qi.Total != 2 || qi.Partitions != 1 {
		t.Fatalf("a refused push changed the queue: total=%d partitions=%d", qi.Total, qi.Partitions)
	}
}

// liveDataBytes is the size of the store's live sstables and blob files
// (Pebble removes obsolete files asynchronously, and the WAL files it keeps
// for recycling are not data). Payloads of blobMinSize bytes or more live in
// the blob files.
func liveDataBytes(s *Store) int64 {
	m := s.db.Metrics()
	return m.Total().TablesSize + int64(m.BlobFiles.LiveSize)
}

// fillForRetention pushes perPart messages of size bytes into each of parts
// partitions of a queue with retentionSeconds=10, at the harness's time.
func fillForRetention(h *harness, parts, perPart, size int) {
	// Incompressible payloads, so sizes on disk mean something.
	rng := rand.New(rand.NewSource(int64(parts*perPart + size)))
	raw := make([]byte, size/2)
	for round := 0; round < perPart; round += 100 {
		n := min(100, perPart-round)
		for p := 0; p < parts; p++ {
			c := &Push{Tenant: "default"}
			for i := 0; i < n; i++ {
				rng.Read(raw)
				payload := `"` + hex.EncodeToString(raw) + `"`
				c.Items = append(c.Items, PushItem{Queue: "big", Partition: fmt.Sprintf("p%04d", p), TxID: fmt.Sprintf("%d-%d-%d", p, round, i), Payload: []byte(payload)})
			}
			h.apply(c)
		}
	}
}

// TestRetentionReclaimsDisk: after retention removed everything and Pebble
// compacted, the store takes a fraction of the space it took.
func TestRetentionReclaimsDisk(t *testing.T) {
	h := newHarness(t)
	h.configure("big", map[string]string{"retentionSeconds": "10"})
	fillForRetention(h, 20, 1000, 1024) // 20,000 messages, ~20 MiB
	flushStore(t, h.s)
	before := liveDataBytes(h.s)
	h.now += 20e6
	for h.apply(&Tick{})[0].(*CountResult).Count > 0 {
	}
	flushStore(t, h.s)
	if err := h.s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	after := liveDataBytes(h.s)
	t.Logf("store size before retention %d KiB, after retention and compaction %d KiB", before>>10, after>>10)
	if before < 10<<20 || after > before/10 {
		t.Fatalf("disk not reclaimed: %d -> %d bytes", before, after)
	}
}

// BenchmarkRetention times removing every message of 1,000 partitions by
// retention at two sizes; the time per run should not grow with the count.
// Run: go test ./internal/state -run '^$' -bench BenchmarkRetention -benchtime 1x
func BenchmarkRetention(b *testing.B) {
	for _, perPart := range []int{100, 1000} {
		b.Run(fmt.Sprintf("messages=%d", perPart*1000), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				h := newHarness(b)
				h.configure("big", map[string]string{"retentionSeconds": "10"})
				fillForRetention(h, 1000, perPart, 16)
				h.now += 20e6
				b.StartTimer()
				for h.apply(&Tick{})[0].(*CountResult).Count > 0 {
				}
				b.StopTimer()
				if qi := h.queueInfo("big"); qi.Total != 0 {
					b.Fatalf("%d messages left", qi.Total)
				}
				h.s.Close()
			}
		})
	}
}

// TestMaxWaitTimeSeconds: a queue with maxWaitTimeSeconds drops messages
// that waited longer than that, by range, counting them as skipped for the
// groups that had not finished them; younger messages stay and consumers
// carry on. Queen's eviction does the same.
func TestMaxWaitTimeSeconds(t *testing.T) {
	h := newHarness(t)
	h.configure("w", map[string]string{"maxWaitTimeSeconds": "30"})
	h.push("w", "p", `1`, `2`, `3`)
	h.pop(Pop{Queue: "w", Group: "g", SubMode: "all", Batch: 1, Partitions: 1, Partition: ptr("p9")}) // g exists, read nothing
	h.now += 20e6
	h.push("w", "p", `4`)
	h.now += 15e6 // 1-3 waited 35 s, 4 waited 15 s
	for i := 0; i < 5; i++ {
		h.apply(&Tick{})
		h.now += 1e6
	}
	qi := h.queueInfo("w")
	if qi.Total != 1 || qi.Deleted != 3 {
		t.Fatalf("after maxWaitTimeSeconds=30: total=%d deleted=%d, want 1 and 3", qi.Total, qi.Deleted)
	}
	if qi.Options.MaxWaitTimeSeconds != 30 || qi.Options.Extra["maxWaitTimeSeconds"] != nil {
		t.Fatalf("options %+v: maxWaitTimeSeconds must be a named option", qi.Options)
	}
	r := h.pop(Pop{Queue: "w", Group: "g", Batch: 10, Partitions: 10, AutoAck: true})
	if len(r.Messages) != 1 || string(r.Messages[0].Payload) != "4" {
		t.Fatalf("group after eviction got %+v, want only 4", r.Messages)
	}
	rd := h.s.Reader()
	defer rd.Close()
	for _, g := range rd.Groups("default", "") {
		if g.Group == "g" && (g.Skipped != 3 || g.Pending != 0) {
			t.Fatalf("group g skipped=%d pending=%d, want 3 and 0", g.Skipped, g.Pending)
		}
	}
	// Turned on later, or shortened, it covers what is already stored.
	h.configure("w2", map[string]string{"retentionSeconds": "3600"})
	h.push("w2", "p", `1`)
	h.now += 20e6
	h.configure("w2", map[string]string{"maxWaitTimeSeconds": "10"})
	for i := 0; i < 5; i++ {
		h.apply(&Tick{})
		h.now += 1e6
	}
	if qi := h.queueInfo("w2"); qi.Total != 0 {
		t.Fatalf("maxWaitTimeSeconds=10 set on a queue whose message waited 20 s keeps %d messages", qi.Total)
	}
}
