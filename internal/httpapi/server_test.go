package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestPanicAfterPartialReply: a handler that panics before replying gets
// the 500 error reply; one that panics after part of its reply is out gets
// its connection aborted, never a second reply appended to the first.
func TestPanicAfterPartialReply(t *testing.T) {
	s := New(authzBroker(t), Config{})
	s.mux.HandleFunc("GET /test/panic-before", func(w http.ResponseWriter, r *http.Request) { panic("before") })
	s.mux.HandleFunc("GET /test/panic-after", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		w.Write([]byte(`{"messages":[`))
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		panic("after")
	})
	srv := httptest.NewServer(s)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/test/panic-before")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || !strings.Contains(string(b), `"internal"`) {
		t.Fatalf("panic before replying: %d %s, want 500 internal", resp.StatusCode, b)
	}

	resp, err = http.Get(srv.URL + "/test/panic-after")
	if err != nil {
		t.Fatalf("panic after a partial reply: %v; want the status and the start of the reply", err)
	}
	b, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || strings.Contains(string(b), "internal") {
		t.Fatalf("panic after a partial reply: read %q, err %v; want the reply cut off (an error), with no error reply appended", b, err)
	}
}
