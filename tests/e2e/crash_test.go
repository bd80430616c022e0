package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The crash test kills the real binary with SIGKILL in the middle of a
// stream of pushes and acks from several clients, restarts it on the same
// data, and checks that nothing acknowledged was lost or duplicated.

// crashDo sends one request and returns status and body (errors when the
// server is gone, which the workload treats as the end).
func crashDo(s *server, method, path string, body any) (int, []byte, error) {
	r, err := s.roundTrip(method, path, body)
	if err != nil {
		return 0, nil, err
	}
	return r.Status, r.Body, nil
}

type crashPopped struct {
	LeaseID  string `json:"leaseId"`
	Messages []struct {
		TransactionID string          `json:"transactionId"`
		PartitionID   string          `json:"partitionId"`
		Partition     string          `json:"partition"`
		Offset        uint64          `json:"offset"`
		Data          json.RawMessage `json:"data"`
	} `json:"messages"`
}

func trials() int {
	if v, err := strconv.Atoi(os.Getenv("QUEEN_TRIALS")); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return 1
	}
	return 3
}

// TestKill9DuringPushAndAck: every push answered 201 is present exactly once
// after the restart, and every message whose ack was answered success is
// never delivered to that group again.
func TestKill9DuringPushAndAck(t *testing.T) {
	for _, mode := range []string{"always", "interval"} {
		for trial := 0; trial < trials(); trial++ {
			t.Run(fmt.Sprintf("fsync=%s/trial%d", mode, trial), func(t *testing.T) { crashTrial(t, int64(trial), withEnv("QUEEN_FSYNC", mode)) })
		}
	}
}

func crashTrial(t *testing.T, seed int64, opts ...serverOpt) {
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	srv := startServer(t, opts...)

	var mu sync.Mutex
	pushed := map[string]bool{}  // txid answered 201
	acked := map[string]bool{}   // txid whose ack answered success
	ackSent := map[string]bool{} // txid whose ack was sent (answered or not)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				var items []map[string]any
				var ids []string
				for k := 0; k < 1+seq%10; k++ {
					id := fmt.Sprintf("c%d-%d-%d", p, seq, k)
					ids = append(ids, id)
					items = append(items, map[string]any{"queue": "crash", "partition": fmt.Sprintf("p%d", (seq+k)%8), "transactionId": id, "payload": map[string]any{"id": id}})
				}
				code, _, err := crashDo(srv, "POST", "/api/v1/push", map[string]any{"items": items})
				if err != nil {
					return // the server is gone
				}
				if code == 201 {
					mu.Lock()
					for _, id := range ids {
						pushed[id] = true
					}
					mu.Unlock()
				}
			}
		}(p)
	}
	for c := 0; c < 2; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, body, err := crashDo(srv, "GET", "/api/v1/pop/queue/crash?batch=50&partitions=4&consumerGroup=g&subscriptionMode=all&leaseSeconds=5", nil)
				if err != nil {
					return
				}
				if code != 200 {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				var p crashPopped
				if err := json.Unmarshal(body, &p); err != nil {
					t.Errorf("pop reply: %v: %s", err, body)
					return
				}
				var acks []map[string]any
				mu.Lock()
				for _, m := range p.Messages {
					ackSent[m.TransactionID] = true
				}
				mu.Unlock()
				for _, m := range p.Messages {
					acks = append(acks, map[string]any{"transactionId": m.TransactionID, "partitionId": m.PartitionID, "leaseId": p.LeaseID, "status": "completed"})
				}
				code, body, err = crashDo(srv, "POST", "/api/v1/ack/batch", map[string]any{"consumerGroup": "g", "acknowledgments": acks})
				if err != nil {
					return
				}
				if code != 200 {
					continue
				}
				var res []struct {
					Success bool `json:"success"`
				}
				if json.Unmarshal(body, &res) != nil || len(res) != len(p.Messages) {
					t.Errorf("ack reply: %s", body)
					return
				}
				mu.Lock()
				for i, r := range res {
					if r.Success {
						acked[p.Messages[i].TransactionID] = true
					}
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Duration(800+rng.Intn(1500)) * time.Millisecond)
	srv.Kill()
	close(stop)
	wg.Wait()
	mu.Lock()
	nPushed, nAcked := len(pushed), len(acked)
	mu.Unlock()
	if nPushed == 0 || nAcked == 0 {
		t.Logf("server log:\n%s", srv.logTail())
		t.Fatalf("workload too small to test anything: pushed %d, acked %d", nPushed, nAcked)
	}

	srv.Restart(t)
	// Every message, once: read everything through a fresh group.
	seen := map[string]int{}
	for {
		code, body, err := crashDo(srv, "GET", "/api/v1/pop/queue/crash?batch=10000&partitions=100&consumerGroup=verify&subscriptionMode=all&autoAck=true", nil)
		if err != nil {
			t.Fatal(err)
		}
		if code == 204 {
			break
		}
		var p crashPopped
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		for _, m := range p.Messages {
			seen[m.TransactionID]++
		}
	}
	for id := range pushed {
		if seen[id] != 1 {
			t.Errorf("push %s answered 201 is present %d times after restart", id, seen[id])
		}
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("message %s stored %d times", id, n)
		}
	}
	// Acknowledged messages never come back to group g, even after the
	// leases taken before the crash expire.
	time.Sleep(5500 * time.Millisecond)
	redelivered := 0
	got := map[string]bool{}
	for {
		code, body, err := crashDo(srv, "GET", "/api/v1/pop/queue/crash?batch=10000&partitions=100&consumerGroup=g&autoAck=true", nil)
		if err != nil {
			t.Fatal(err)
		}
		if code == 204 {
			break
		}
		var p crashPopped
		json.Unmarshal(body, &p)
		for _, m := range p.Messages {
			redelivered++
			got[m.TransactionID] = true
			if acked[m.TransactionID] {
				t.Errorf("message %s was acknowledged before the crash but delivered again", m.TransactionID)
			}
		}
	}
	// Group position intact: every stored message whose ack was never sent
	// is delivered to g (acks in flight at the kill may or may not have
	// been applied, so those may go either way).
	for id := range seen {
		if !ackSent[id] && !got[id] {
			t.Errorf("message %s was never acknowledged but group g does not deliver it after restart", id)
		}
	}
	t.Logf("pushed %d (answered 201), stored %d, acked %d, redelivered unacked %d", nPushed, len(seen), nAcked, redelivered)
}
