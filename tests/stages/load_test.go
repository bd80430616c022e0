package stages

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

const payload = `{"x":"abcdefghijklmnopqrstuvwx"}` // 30 bytes, as the bench's small pushes

// pushBody is a push of n small messages, to one partition or spread over
// partitions.
func pushBody(queue string, n, partitions, first int) []byte {
	b := []byte(`{"items":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"queue":%q,"partition":"p%d","payload":%s}`, queue, (first+i)%partitions, payload)
	}
	return append(b, "]}"...)
}

// do sends one request and reads the whole reply; it checks the status.
func (s *server) do(ctx context.Context, method, path string, body []byte, want ...int) ([]byte, int, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.http.URL+path, rd)
	if err != nil {
		return nil, 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, resp.StatusCode, err
	}
	for _, w := range want {
		if resp.StatusCode == w {
			return out, resp.StatusCode, nil
		}
	}
	return out, resp.StatusCode, fmt.Errorf("%s %s: status %d (want %v): %.200s", method, path, resp.StatusCode, want, out)
}

// loadResult is what the clients saw.
type loadResult struct {
	msgs    int64
	elapsed time.Duration
	// latency of each request the clients sent in the window, by kind.
	latency map[string][]time.Duration
}

type latencies struct {
	mu sync.Mutex
	m  map[string][]time.Duration
}

func (l *latencies) add(kind string, d time.Duration) {
	l.mu.Lock()
	l.m[kind] = append(l.m[kind], d)
	l.mu.Unlock()
}

// runPush: clients closed-loop clients push batches of 100 to one
// partition for d.
func runPush(s *server, queue string, clients int, d time.Duration) (loadResult, error) {
	lat := &latencies{m: map[string][]time.Duration{}}
	var msgs atomic.Int64
	errs := make(chan error, clients)
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := pushBody(queue, 100, 1, c)
			for time.Since(start) < d {
				t0 := time.Now()
				if _, _, err := s.do(context.Background(), http.MethodPost, "/api/v1/push", body, http.StatusCreated); err != nil {
					errs <- err
					return
				}
				lat.add("push", time.Since(t0))
				msgs.Add(100)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return loadResult{}, err
	}
	return loadResult{msgs: msgs.Load(), elapsed: el, latency: lat.m}, nil
}

// fill pushes n messages (batches of 100 over 100 partitions) with 8
// clients.
func fill(s *server, queue string, n int) error {
	var next atomic.Int64
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(100) - 100
				if i >= int64(n) {
					return
				}
				if _, _, err := s.do(context.Background(), http.MethodPost, "/api/v1/push", pushBody(queue, 100, 100, int(i)), http.StatusCreated); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

type popReply struct {
	LeaseID  string `json:"leaseId"`
	Messages []struct {
		TransactionID string `json:"transactionId"`
		PartitionID   string `json:"partitionId"`
		LeaseID       string `json:"leaseId"`
	} `json:"messages"`
}

// runPopAck: clients closed-loop consumers of one group pop 100 (over up
// to 10 partitions, as the bench's consumers) and ack them in one batch,
// for d or until the queue is empty.
func runPopAck(s *server, queue string, clients int, d time.Duration) (loadResult, error) {
	lat := &latencies{m: map[string][]time.Duration{}}
	var msgs atomic.Int64
	errs := make(chan error, clients)
	path := "/api/v1/pop/queue/" + queue + "?batch=100&partitions=10&consumerGroup=g&subscriptionMode=all"
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < d {
				t0 := time.Now()
				body, st, err := s.do(context.Background(), http.MethodGet, path, nil, http.StatusOK, http.StatusNoContent)
				if err != nil {
					errs <- err
					return
				}
				if st == http.StatusNoContent {
					return // drained
				}
				lat.add("pop", time.Since(t0))
				t1 := time.Now()
				n, err := runAck(s, body)
				if err != nil {
					errs <- err
					return
				}
				lat.add("ack", time.Since(t1))
				lat.add("pop+ack", time.Since(t0))
				msgs.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return loadResult{}, err
	}
	return loadResult{msgs: msgs.Load(), elapsed: el, latency: lat.m}, nil
}

// runAck acknowledges (completed) every message of a pop reply in one
// /ack/batch; it returns how many.
func runAck(s *server, popBody []byte) (int, error) {
	var r popReply
	if err := json.Unmarshal(popBody, &r); err != nil {
		return 0, fmt.Errorf("pop reply: %w: %.200s", err, popBody)
	}
	if len(r.Messages) == 0 {
		return 0, fmt.Errorf("pop reply without messages: %.200s", popBody)
	}
	ack := []byte(`{"consumerGroup":"g","acknowledgments":[`)
	for i, m := range r.Messages {
		if i > 0 {
			ack = append(ack, ',')
		}
		ack = fmt.Appendf(ack, `{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"}`, m.TransactionID, m.PartitionID, r.LeaseID)
	}
	ack = append(ack, "]}"...)
	reply, _, err := s.do(context.Background(), http.MethodPost, "/api/v1/ack/batch", ack, http.StatusOK)
	if err != nil {
		return 0, err
	}
	if bytes.Count(reply, []byte(`"success":true`)) != len(r.Messages) {
		return 0, fmt.Errorf("ack of %d messages: %.300s", len(r.Messages), reply)
	}
	return len(r.Messages), nil
}
