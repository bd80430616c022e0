package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestQueenSideRawClient runs the whole queen side against the fake server
// through the lean client.
func TestQueenSideRawClient(t *testing.T) {
	f := newFakeQueen()
	var raw, std atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/push" || strings.HasPrefix(r.URL.Path, "/api/v1/pop/") || r.URL.Path == "/api/v1/ack/batch" {
			if r.UserAgent() == "queen-bench-raw" {
				raw.Add(1)
			} else {
				std.Add(1)
			}
		}
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	testQueenSide(t, f, srv.URL, "-queen-client", "raw")
	if raw.Load() == 0 || std.Load() != 0 {
		t.Fatalf("pushes, pops and acks: %d through the lean client, %d through net/http; want all lean", raw.Load(), std.Load())
	}
}

func TestRawConnReplies(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked":
			w.WriteHeader(200)
			for i := range 3 {
				fmt.Fprintf(w, "part%d;", i)
				w.(http.Flusher).Flush()
			}
		case "/empty":
			w.WriteHeader(204)
		case "/close":
			w.Header().Set("Connection", "close")
			w.Write([]byte("bye"))
		case "/echo":
			var b bytes.Buffer
			b.ReadFrom(r.Body)
			w.WriteHeader(201)
			w.Write(b.Bytes())
		default:
			http.NotFound(w, r)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	if err := checkRawBase(srv.URL); err != nil {
		t.Fatal(err)
	}
	rc := &rawConn{host: strings.TrimPrefix(srv.URL, "http://")}
	defer rc.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp bytes.Buffer
	check := func(method, path string, body []byte, wantStatus int, wantBody string) {
		t.Helper()
		st, err := rc.do(ctx, method, path, body, &resp)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		if st != wantStatus || resp.String() != wantBody {
			t.Fatalf("%s %s: got %d %q, want %d %q", method, path, st, resp.String(), wantStatus, wantBody)
		}
	}
	check("GET", "/chunked", nil, 200, "part0;part1;part2;")
	check("GET", "/empty", nil, 204, "")
	check("POST", "/echo", []byte(`{"a":1}`), 201, `{"a":1}`)
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for three exchanges, want 1 (kept alive)", n)
	}
	check("GET", "/close", nil, 200, "bye")
	check("GET", "/nope", nil, 404, "404 page not found\n")
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections after a Connection: close reply, want 2", n)
	}
	if _, err := parseFlags([]string{"-queen-url", "https://x:1", "-queen-client", "raw"}); err == nil || !strings.Contains(err.Error(), "http://") {
		t.Fatalf("https base with -queen-client raw: err %v, want a refusal naming http://", err)
	}
}

// TestRawConnCancel: a canceled context ends a read that waits.
func TestRawConnCancel(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	defer srv.Close()
	defer close(release)
	rc := &rawConn{host: strings.TrimPrefix(srv.URL, "http://")}
	defer rc.close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	var resp bytes.Buffer
	start := time.Now()
	_, err := rc.do(ctx, "GET", "/wait", nil, &resp)
	if err == nil || ctx.Err() == nil {
		t.Fatalf("err %v after cancel, want an error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cancel took %v", d)
	}
}
