package httpapi

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Clients that hang up while their push is in flight are not server
// errors and not a leader change: the log says the client ended them.
func TestClientCancelIsNotLoggedAsFailure(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := httptest.NewServer(New(authzBroker(t), Config{Logger: log}))
	t.Cleanup(srv.Close)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	body := `{"items":[` + strings.Repeat(`{"queue":"cancel-q","payload":{"x":"0123456789012345678901234567890123456789"}},`, 99) +
		`{"queue":"cancel-q","payload":{"x":1}}]}`
	deadline := time.Now().Add(20 * time.Second)
	for ended := 0; ended < 10; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests ended by their client in 20 s:\n%s", ended, logs.String())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(200+rng.IntN(3000))*time.Microsecond)
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/api/v1/push", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
		}
		// The server notices the hang-up on its side; poll for its line.
		want := ended + 1
		for i := 0; i < 50 && strings.Count(logs.String(), "request ended by its client") < want; i++ {
			time.Sleep(2 * time.Millisecond)
		}
		ended = strings.Count(logs.String(), "request ended by its client")
	}
	// Let requests still being handled finish and log.
	time.Sleep(200 * time.Millisecond)
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "leader changed") {
			t.Errorf("a client's hang-up logged as a failure:\n%s", line)
		}
	}
}
