package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// popAckBatch and popAckParts are the bench's pop: 100 messages over up
// to 10 partitions of one group, then one /ack/batch of them all.
const popAckBatch, popAckParts = 100, 10

// nullWriter is a ResponseWriter that keeps the last reply and allocates
// nothing itself once warm.
type nullWriter struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (w *nullWriter) Header() http.Header { return w.h }
func (w *nullWriter) WriteHeader(c int)   { w.code = c }
func (w *nullWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = 200
	}
	return w.body.Write(b)
}

// SetReadDeadline is what http.ResponseController calls on a real
// connection's writer.
func (w *nullWriter) SetReadDeadline(time.Time) error { return nil }

func (w *nullWriter) reset() {
	clear(w.h)
	w.code = 0
	w.body.Reset()
}

// popAckFixture is a broker with a queue of n messages over popAckParts
// partitions, and its HTTP server.
func popAckFixture(t testing.TB, n int) (*broker.Broker, *Server) {
	t.Helper()
	b := authzBroker(t)
	payload := []byte(`{"id":123456,"customer":"c-00042","amount":"19.99"}`)
	for sent := 0; sent < n; sent += 500 {
		items := make([]broker.PushItem, min(500, n-sent))
		for j := range items {
			items[j] = broker.PushItem{Queue: "pa", Partition: "p" + strconv.Itoa(j%popAckParts), Payload: payload}
		}
		if _, err := b.Push(context.Background(), "default", items); err != nil {
			t.Fatal(err)
		}
	}
	return b, New(b, Config{})
}

// popAckCycle is one consumer's cycle as a client writes it: GET pop, then
// POST /ack/batch naming each message by transactionId, partitionId and
// leaseId. measured wraps the two ServeHTTP calls (and nothing of the
// client's own work).
type popAckCycle struct {
	s       *Server
	group   string
	w       nullWriter
	ackBody []byte
}

func (c *popAckCycle) run(measured func(func())) error {
	path := fmt.Sprintf("/api/v1/pop/queue/pa?batch=%d&partitions=%d&consumerGroup=%s&subscriptionMode=all", popAckBatch, popAckParts, c.group)
	req, err := http.NewRequest(http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	c.w.reset()
	measured(func() { c.s.ServeHTTP(&c.w, req) })
	if c.w.code != http.StatusOK {
		return fmt.Errorf("pop: %d %s", c.w.code, c.w.body.Bytes())
	}
	var rep struct {
		Messages []struct {
			TransactionID string `json:"transactionId"`
			PartitionID   string `json:"partitionId"`
			LeaseID       string `json:"leaseId"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(c.w.body.Bytes(), &rep); err != nil {
		return fmt.Errorf("pop reply: %v", err)
	}
	if len(rep.Messages) != popAckBatch {
		return fmt.Errorf("pop gave %d messages, want %d", len(rep.Messages), popAckBatch)
	}
	b := append(c.ackBody[:0], `{"consumerGroup":"`+c.group+`","acknowledgments":[`...)
	for i, m := range rep.Messages {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"}`, m.TransactionID, m.PartitionID, m.LeaseID)
	}
	c.ackBody = append(b, "]}"...)
	req, err = http.NewRequest(http.MethodPost, "/api/v1/ack/batch", bytes.NewReader(c.ackBody))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	c.w.reset()
	measured(func() { c.s.ServeHTTP(&c.w, req) })
	if c.w.code != http.StatusOK {
		return fmt.Errorf("ack: %d %s", c.w.code, c.w.body.Bytes())
	}
	if n := bytes.Count(c.w.body.Bytes(), []byte(`"success":true`)); n != popAckBatch {
		return fmt.Errorf("ack: %d of %d succeeded: %s", n, popAckBatch, c.w.body.Bytes())
	}
	return nil
}

// mallocs counts the process's allocations while f runs.
func mallocs(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.Mallocs - a.Mallocs
}

// TestPopAckHTTPAllocations: the HTTP layer of a pop of 100 and its ack
// (handlers, their JSON, the query, the middleware; net/http's own
// connection handling is not in it) allocates a bounded number of objects
// over what the broker's Pop and Ack allocate for the same messages: none
// per message, a few per request.
func TestPopAckHTTPAllocations(t *testing.T) {
	const runs = 20
	b, s := popAckFixture(t, 2*runs*popAckBatch+2*popAckBatch)
	ctx := context.Background()

	// The broker alone (the same pop, and an ack of the same shape) and
	// the same through the handlers, alternately, so that the background
	// work of the node falls on both alike.
	acks := make([]broker.AckItem, popAckBatch)
	direct := func() error {
		r, err := b.Pop(ctx, broker.PopRequest{Tenant: "default", Queue: "pa", Group: "direct", Batch: popAckBatch, Partitions: popAckParts, SubscriptionMode: "all"})
		if err != nil || len(r.Messages) != popAckBatch {
			return fmt.Errorf("pop: %v, %d messages", err, len(r.Messages))
		}
		for j, m := range r.Messages {
			acks[j] = broker.AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: "direct", LeaseID: m.LeaseID, Status: "completed"}
		}
		out, err := b.Ack(ctx, "default", acks)
		if err == nil && len(out) != popAckBatch {
			err = fmt.Errorf("ack: %d outcomes", len(out))
		}
		return err
	}
	c := &popAckCycle{s: s, group: "http", w: nullWriter{h: http.Header{}}}
	// Allocations are counted process-wide, so the node's background work
	// (raft ticks, the syncer, Pebble) lands in some cycles. The median of
	// the per-cycle differences ignores those bursts; an allocation per
	// message would still add about 2*popAckBatch to every cycle.
	var brokerN, httpN uint64
	owns := make([]float64, 0, runs)
	for i := range runs + 1 {
		var err error
		n := mallocs(func() { err = direct() })
		if err != nil {
			t.Fatal(err)
		}
		var m uint64
		if err := c.run(func(f func()) { m += mallocs(f) }); err != nil {
			t.Fatal(err)
		}
		if i > 0 { // the first warms caches and pools
			brokerN += n
			httpN += m
			owns = append(owns, float64(m)-float64(n))
		}
	}
	sort.Float64s(owns)
	perBroker, perHTTP := float64(brokerN)/runs, float64(httpN)/runs
	own := owns[len(owns)/2]
	t.Logf("allocations per pop+ack of %d: broker %.1f, through the handlers %.1f (means), the HTTP layer's own %.1f (median; %.2f per message; range %.0f..%.0f)",
		popAckBatch, perBroker, perHTTP, own, own/popAckBatch, owns[0], owns[len(owns)-1])
	limit := 45.0
	if raceDetector {
		limit = 80
	}
	if own > limit {
		t.Fatalf("the HTTP layer added %.1f allocations to a pop+ack of %d messages (%.2f per message); want at most %.0f",
			own, popAckBatch, own/popAckBatch, limit)
	}
}

// BenchmarkPopAckHTTP runs the cycle of TestPopAckHTTPAllocations through
// the handlers, for profiles of the HTTP layer without net/http's
// connection handling.
func BenchmarkPopAckHTTP(b *testing.B) {
	_, s := popAckFixture(b, (b.N+1)*popAckBatch)
	c := &popAckCycle{s: s, group: "bench", w: nullWriter{h: http.Header{}}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := c.run(func(f func()) { f() }); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*popAckBatch)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkDecodeAckBatch decodes the bench's ack of 100 (transactionId,
// partitionId, leaseId and status per item).
func BenchmarkDecodeAckBatch(b *testing.B) {
	body := []byte(`{"consumerGroup":"g4","acknowledgments":[`)
	for i := range popAckBatch {
		if i > 0 {
			body = append(body, ',')
		}
		body = fmt.Appendf(body, `{"transactionId":"0193b2c4-5d6e-7f80-9a1b-%012d","partitionId":"%d","leaseId":"0193b2c4-aaaa-7f80-9a1b-2c3d4e5f6a7b","status":"completed"}`, i, 1000+i%10)
	}
	body = append(body, "]}"...)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for range b.N {
		items, e := DecodeAckBatch(body)
		if e != nil || len(items) != popAckBatch {
			b.Fatalf("decoded %d items, err %v", len(items), e)
		}
	}
}
