package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// Each raft line is one slog record at raft's level, with its pairs as
// attributes, one timestamp and no hclog level tag inside.
func TestRaftLinesAreSlogRecords(t *testing.T) {
	var buf syncBuffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := hclogFor(l, "raft")
	peer := raft.Server{ID: "n2", Address: "127.0.0.1:7001"}
	for _, c := range []struct {
		log   func(string, ...any)
		msg   string
		args  []any
		level string
	}{
		{h.Error, "failed to appendEntries to", []any{"peer", peer, "error", errors.New("dial tcp: connection refused")}, "ERROR"},
		{h.Warn, "failed to contact", []any{"server-id", "n3", "time", 2 * time.Second}, "WARN"},
		{h.Info, "entering leader state", []any{"leader", "n1"}, "INFO"},
		{h.Debug, "pipelining replication", []any{"peer", peer}, "DEBUG"},
		{h.Named("snapshot").Error, "failed to open", []any{"error", errors.New("boom")}, "ERROR"},
		{h.Info, "initial configuration", []any{"index", 1, "servers", hclog.Fmt("%+v", []raft.Server{peer})}, "INFO"},
		{h.Error, "failed to decode incoming command", []any{"error", "transport shutdown"}, "DEBUG"},
	} {
		before := len(lines(buf.String()))
		c.log(c.msg, c.args...)
		got := lines(buf.String())
		if len(got) != before+1 {
			t.Fatalf("%s: %d lines logged, want 1:\n%s", c.msg, len(got)-before, buf.String())
		}
		line := got[len(got)-1]
		if !strings.Contains(line, "level="+c.level+" ") {
			t.Errorf("%q: want level=%s:\n%s", c.msg, c.level, line)
		}
		if n := strings.Count(" "+line, " time="); n != 1 {
			t.Errorf("%q: %d timestamps, want 1:\n%s", c.msg, n, line)
		}
		for _, tag := range []string{"[ERROR]", "[WARN]", "[INFO]", "[DEBUG]"} {
			if strings.Contains(line, tag) {
				t.Errorf("%q: hclog's %s tag inside the slog record:\n%s", c.msg, tag, line)
			}
		}
		if !strings.Contains(line, fmt.Sprintf("msg=%q", c.msg)) || !strings.Contains(line, "component=raft") {
			t.Errorf("%q: want msg and component as attributes:\n%s", c.msg, line)
		}
	}
	if s := buf.String(); !strings.Contains(s, `error="dial tcp: connection refused"`) || !strings.Contains(s, "component=raft.snapshot") || !strings.Contains(s, "server-id=n3") ||
		!strings.Contains(s, `servers="[{Suffrage:Voter ID:n2 Address:127.0.0.1:7001}]"`) {
		t.Errorf("attributes lost:\n%s", s)
	}
	// A logger at Warn drops raft's Info and Debug lines.
	buf2 := &syncBuffer{}
	h2 := hclogFor(slog.New(slog.NewTextHandler(buf2, &slog.HandlerOptions{Level: slog.LevelWarn})), "raft")
	h2.Info("entering follower state")
	h2.Debug("x")
	if h2.IsInfo() || buf2.String() != "" {
		t.Errorf("Info passed a Warn logger (IsInfo %v): %q", h2.IsInfo(), buf2.String())
	}
	// The standard-library writer reads hclog's level tags.
	h.StandardLogger(nil).Print("[ERROR] raft-net: failed to accept connection")
	last := lines(buf.String())
	if line := last[len(last)-1]; !strings.Contains(line, "level=ERROR") || strings.Contains(line, "[ERROR]") {
		t.Errorf("standard logger line: %s", line)
	}
}

// The election every node holds when it starts, knowing no leader yet, is
// not a warning; one after losing a known leader is.
func TestStartupElectionIsNotAWarning(t *testing.T) {
	var buf syncBuffer
	h := hclogFor(slog.New(slog.NewTextHandler(&buf, nil)), "raft")
	h.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
	h.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "127.0.0.1:7001", "last-leader-id", "n2")
	got := lines(buf.String())
	if len(got) != 2 || !strings.Contains(got[0], "level=INFO") || !strings.Contains(got[1], "level=WARN") {
		t.Fatalf("want INFO then WARN:\n%s", buf.String())
	}

	// A real single voter, started twice (bootstrap, then restart), warns
	// about nothing.
	var nodeLog syncBuffer
	cfg := Config{DataDir: filepath.Join(t.TempDir(), "n1"), NodeID: "n1", RaftAddr: freeAddr(t),
		Logger: slog.New(slog.NewTextHandler(&nodeLog, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	for i := 0; i < 2; i++ {
		n, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for !n.IsLeader() && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		if !n.IsLeader() {
			t.Fatalf("start %d: the single voter does not lead", i+1)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, line := range lines(nodeLog.String()) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("a single voter's start logs a warning or error:\n%s", line)
		}
	}
	if !strings.Contains(nodeLog.String(), "heartbeat timeout reached") {
		t.Errorf("raft's start-up election line is missing (want it at INFO):\n%s", nodeLog.String())
	}
}

// A line repeated for one peer is logged once per window, then again with
// the count it held back; another peer's line is not held back by it.
func TestRaftRepeatsAreRateLimited(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	var buf syncBuffer
	l := slog.New(slog.NewTextHandler(&buf, nil))
	lvl := hclog.Trace
	h := &raftLogger{l: l, name: "raft", level: &lvl, rate: newRepeatLimiter(repeatWindow, clock)}
	dead := raft.Server{ID: "n3", Address: "127.0.0.1:7003"}
	other := raft.Server{ID: "n2", Address: "127.0.0.1:7002"}
	// A dead follower: 4 lines a second for 25 s.
	for i := 0; i < 100; i++ {
		h.Error("failed to appendEntries to", "peer", dead, "error", "dial tcp 127.0.0.1:7003: connection refused")
		if i == 10 {
			h.Error("failed to appendEntries to", "peer", other, "error", "i/o timeout")
		}
		advance(250 * time.Millisecond)
	}
	got := lines(buf.String())
	var deadLines []string
	otherLines := 0
	for _, line := range got {
		switch {
		case strings.Contains(line, "n3"):
			deadLines = append(deadLines, line)
		case strings.Contains(line, "n2"):
			otherLines++
		}
	}
	// At 0 s, 10 s and 20 s.
	if len(deadLines) != 3 || otherLines != 1 {
		t.Fatalf("%d lines for the dead peer (want 3), %d for the other (want 1):\n%s", len(deadLines), otherLines, buf.String())
	}
	if strings.Contains(deadLines[0], "repeats_suppressed") || !strings.Contains(deadLines[1], "repeats_suppressed=39") || !strings.Contains(deadLines[2], "repeats_suppressed=39") {
		t.Errorf("want no count on the first line, then 39 held back per 10 s:\n%s", strings.Join(deadLines, "\n"))
	}
}
