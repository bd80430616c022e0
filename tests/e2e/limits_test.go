package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// What one request may cost: a transaction's items, the time and memory
// its body may take, and the size of the options a queue stores.

// TestTransactionPushLimit: the push operations of a transaction hold at
// most as many items together as one push; a bigger one stores nothing.
func TestTransactionPushLimit(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	ops := func(perOp ...int) string {
		var b strings.Builder
		b.WriteString(`{"operations":[`)
		for o, n := range perOp {
			if o > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"type":"push","items":[`)
			for i := 0; i < n; i++ {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"queue":"txn-limit","partition":"p%d","payload":%d}`, i%4, i)
			}
			b.WriteString(`]}`)
		}
		b.WriteString(`]}`)
		return b.String()
	}
	e := s.expectError(t, "POST", "/api/v1/transaction", ops(6000, 4001), 400, "invalid_parameter", "operations")
	if !strings.Contains(e.Message, "10000") || !strings.Contains(e.Message, "10001") {
		t.Errorf("the error should name the limit and the count: %+v", e)
	}
	if _, ok := s.queues(t)["txn-limit"]; ok {
		t.Fatalf("a refused transaction created its queue")
	}
	// At the limit it commits, all of it.
	s.callJSON(t, "POST", "/api/v1/transaction", ops(5000, 5000), 200, nil)
	if n := s.queueTotal(t, "txn-limit"); n != 10000 {
		t.Fatalf("queue holds %d messages, want 10000", n)
	}
}

// rawConn opens a TCP connection to the server and sends a request head.
func rawConn(t *testing.T, s *server, head string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.httpAddr)
	if err != nil {
		t.Fatalf("dial %s: %v", s.httpAddr, err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatalf("write request head: %v", err)
	}
	return c
}

// TestSlowBody: a client that sends its body slower than
// QUEEN_BODY_READ_TIMEOUT gets 408 and its connection closes; a request
// after a body on a kept-alive connection is not cut short by it.
func TestSlowBody(t *testing.T) {
	t.Parallel()
	s := startServer(t, withEnv("QUEEN_BODY_READ_TIMEOUT", "1s"))
	for _, tc := range []struct{ name, head string }{
		{"length", "POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"},
		{"chunked", "POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c := rawConn(t, s, tc.head)
			stop := make(chan struct{})
			defer close(stop)
			go func() { // one byte every 100 ms, as a slow client would
				for {
					select {
					case <-stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
					b := " "
					if tc.name == "chunked" {
						b = "1\r\n \r\n"
					}
					if _, err := io.WriteString(c, b); err != nil {
						return
					}
				}
			}()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no reply to a slow body after %v: %v", time.Since(start), err)
			}
			body, _ := io.ReadAll(resp.Body)
			took := time.Since(start)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "QUEEN_BODY_READ_TIMEOUT") {
				t.Fatalf("want 408 naming QUEEN_BODY_READ_TIMEOUT, got %d %s", resp.StatusCode, body)
			}
			if took < 900*time.Millisecond || took > 5*time.Second {
				t.Errorf("408 after %v, want about 1 s", took)
			}
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			// Closed: EOF, or a reset when the server drops the bytes the
			// client kept sending; a timeout means it stayed open.
			if _, err := br.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("the connection should close after the 408; read: %v", err)
			}
		})
	}
	// Keep-alive: a body, then a 2 s long poll on the same connection.
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := hc.Post(s.base+"/api/v1/push", "application/json", strings.NewReader(`{"items":[{"queue":"slow-q","payload":1}]}`))
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("push: %v %v", err, resp)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start := time.Now()
	resp, err = hc.Get(s.base + popPath("slow-q", "consumerGroup=g&subscriptionMode=new&wait=true&timeout=2000"))
	if err != nil {
		t.Fatalf("long poll after a body: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 204 || time.Since(start) < 1900*time.Millisecond {
		t.Fatalf("long poll after a body: %d after %v, want 204 after 2 s", resp.StatusCode, time.Since(start))
	}
}

// TestBodyBudget: bodies in flight hold at most
// QUEEN_MAX_INFLIGHT_BODY_BYTES together; past it a request gets 503 with
// Retry-After, and once they are done requests are served again.
func TestBodyBudget(t *testing.T) {
	t.Parallel()
	s := startServer(t, withEnv("QUEEN_MAX_BODY_BYTES", "1048576"), withEnv("QUEEN_MAX_INFLIGHT_BODY_BYTES", "2097152"),
		withEnv("QUEEN_BODY_READ_TIMEOUT", "20s"))
	// Two clients declare 1 MiB each and send only the start.
	var holders []net.Conn
	for i := 0; i < 2; i++ {
		c := rawConn(t, s, "POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{\"items\":")
		holders = append(holders, c)
	}
	// Both are counted before anything else is sent.
	err := checkFor(10*time.Second, 20*time.Millisecond, func() error {
		r, err := s.roundTrip("GET", "/metrics/prometheus", nil)
		if err != nil {
			return err
		}
		if !strings.Contains(string(r.Body), "\nqueen_http_body_bytes_in_flight 2.097152e+06\n") {
			return fmt.Errorf("queen_http_body_bytes_in_flight is not 2 MiB yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	payload := strings.Repeat("x", 600<<10)
	body := `{"items":[{"queue":"budget-q","payload":"` + payload + `"}]}`
	var r *reply
	err = checkFor(10*time.Second, 20*time.Millisecond, func() error {
		var err error
		if r, err = s.roundTrip("POST", "/api/v1/push", body); err != nil {
			return err
		}
		if r.Status != 503 {
			return fmt.Errorf("want 503 while 2 MiB of bodies are in flight:\n%s", r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ra := r.Header.Get("Retry-After"); ra == "" {
		t.Errorf("503 without Retry-After:\n%s", r)
	}
	if !strings.Contains(string(r.Body), "QUEEN_MAX_INFLIGHT_BODY_BYTES") {
		t.Errorf("503 should name QUEEN_MAX_INFLIGHT_BODY_BYTES:\n%s", r)
	}
	// A chunked body is counted as it grows. (The client may see the
	// connection reset instead of the early 503 while it is still sending;
	// it tries again then.)
	err = checkFor(10*time.Second, 20*time.Millisecond, func() error {
		req, _ := http.NewRequest("POST", s.base+"/api/v1/push", io.MultiReader(strings.NewReader(body)))
		req.ContentLength = -1
		resp, err := s.hc.Do(req)
		if err != nil {
			return fmt.Errorf("chunked push: %w", err)
		}
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 {
			return fmt.Errorf("chunked push while the budget is spent: %d %s, want 503", resp.StatusCode, rb)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Small requests without a body are never refused.
	s.callJSON(t, "GET", "/api/v1/resources/queues", nil, 200, nil)
	for _, c := range holders {
		c.Close()
	}
	err = checkFor(10*time.Second, 20*time.Millisecond, func() error {
		r, err := s.roundTrip("POST", "/api/v1/push", body)
		if err != nil {
			return err
		}
		if r.Status != 201 {
			return fmt.Errorf("after the held bodies closed:\n%s", r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// procKB reads a field of /proc/PID/status: VmRSS (resident set size) or
// VmHWM (its peak).
func procKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read RSS: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatalf("parse %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestBodyMemoryGivenBack: after a burst of large bodies the server's RSS
// comes back down instead of staying at the burst's peak.
func TestBodyMemoryGivenBack(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skipf("needs /proc to read the server's RSS: %v", err)
	}
	t.Parallel()
	s := startServer(t)
	pid := s.pid()
	base := procKB(t, pid, "VmRSS")
	// Four bodies of 48 MiB at once, each read whole and then refused (not
	// JSON), so nothing is stored.
	body := append([]byte(`{"items":"`), bytes.Repeat([]byte("x"), 48<<20)...)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.roundTrip("POST", "/api/v1/push", body)
			if err == nil && r.Status != 400 {
				err = fmt.Errorf("want 400 invalid_json, got %d %s", r.Status, clip(r.Body))
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	peak := procKB(t, pid, "VmHWM")
	t.Logf("RSS before %d MiB, peak in the burst %d MiB", base>>10, peak>>10)
	if peak-base < 100<<10 {
		t.Fatalf("the burst raised RSS only %d MiB; the test does not exercise what it should", (peak-base)>>10)
	}
	err := checkFor(15*time.Second, 100*time.Millisecond, func() error {
		if now := procKB(t, pid, "VmRSS"); now-base > 64<<10 {
			return fmt.Errorf("RSS %d MiB, %d MiB over the %d MiB before the burst", now>>10, (now-base)>>10, base>>10)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
