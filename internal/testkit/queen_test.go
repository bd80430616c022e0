package testkit

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeQueen is a script standing in for the queen binary: it prints its
// QUEEN_ environment and ignores SIGTERM when QUEEN_IGNORE_TERM is set.
func fakeQueen(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "queen")
	script := "#!/bin/sh\nenv | grep '^QUEEN_' | sort\n" +
		"if [ -n \"$QUEEN_IGNORE_TERM\" ]; then trap '' TERM; fi\n" +
		"echo ready\nwhile :; do sleep 0.05; done\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// waitLog waits until the log shows want n times.
func waitLog(t *testing.T, q *Queen, want string, n int) string {
	t.Helper()
	var log string
	if err := CheckFor(10*time.Second, 10*time.Millisecond, func() error {
		if log = q.Log(1 << 20); strings.Count(log, want) < n {
			return os.ErrNotExist
		}
		return nil
	}); err != nil {
		t.Fatalf("log never showed %q %d times:\n%s", want, n, log)
	}
	return log
}

// TestQueenEnvAndRestart: the process gets its addresses, data directory
// and Env, none of the test's own QUEEN_ variables; a second Start while it
// runs fails; after Kill9 it starts again on the same log.
func TestQueenEnvAndRestart(t *testing.T) {
	t.Setenv("QUEEN_LEAKED", "1")
	q := NewQueen(t, fakeQueen(t), "n1")
	q.Env = []string{"QUEEN_NODE_ID=n1", "QUEEN_NODE_ID=n9"}
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	log := waitLog(t, q, "ready", 1)
	for _, want := range []string{"=== start n1 at ", "QUEEN_HTTP_ADDR=" + q.HTTPAddr, "QUEEN_RAFT_ADDR=" + q.RaftAddr,
		"QUEEN_DATA_DIR=" + q.DataDir, "QUEEN_NODE_ID=n9"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "QUEEN_LEAKED") || strings.Contains(log, "QUEEN_NODE_ID=n1\n") {
		t.Errorf("the test's own QUEEN_LEAKED or an overridden entry reached the process:\n%s", log)
	}
	if err := q.Start(); err == nil {
		t.Fatal("a second Start while running succeeded")
	}
	q.Kill9()
	if q.Alive() || q.Running() {
		t.Fatalf("after Kill9: alive %v, running %v", q.Alive(), q.Running())
	}
	if err := q.Restart(); err != nil {
		t.Fatal(err)
	}
	defer q.Kill9()
	if log := waitLog(t, q, "ready", 2); strings.Count(log, "=== start n1") != 2 {
		t.Errorf("want two start banners in the log:\n%s", log)
	}
}

// TestQueenStopKillsAfterTimeout: a process ignoring SIGTERM is killed
// once the time given to Stop has passed, and Stop says so; a clean exit
// status is reported as such.
func TestQueenStopKillsAfterTimeout(t *testing.T) {
	q := NewQueen(t, fakeQueen(t), "n1")
	q.Env = []string{"QUEEN_IGNORE_TERM=1"}
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	waitLog(t, q, "ready", 1)
	start := time.Now()
	err := q.Stop(300 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "of SIGTERM; killed") {
		t.Fatalf("Stop of a process ignoring SIGTERM: %v, want an error saying it was killed", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("killed after %v, before the 300ms given", d)
	}
	if q.Alive() {
		t.Fatal("alive after Stop")
	}

	p, err := StartProcess(exec.Command("sh", "-c", "exit 3"), filepath.Join(t.TempDir(), "log"), "banner")
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if ee, ok := p.ExitErr().(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("exit error %v, want status 3", p.ExitErr())
	}
	if err := p.Signal(syscall.SIGTERM, time.Second); err != nil {
		t.Fatalf("signal to an exited process: %v", err)
	}
}

// TestLogTail: the tail is cut to max bytes and marked; a missing log says
// so.
func TestLogTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := LogTail(path, 4); got != "…(truncated)…\n6789" {
		t.Errorf("LogTail(4) = %q", got)
	}
	if got := LogTail(path, 10); got != "0123456789" {
		t.Errorf("LogTail(10) = %q", got)
	}
	if got := LogTail(path+".missing", 10); !strings.HasPrefix(got, "(no log: ") {
		t.Errorf("missing log: %q", got)
	}
}

// TestFreeAddrsOutsideEphemeralRange: the ports handed out are distinct,
// below the kernel's ephemeral range (where it is known), and bindable.
func TestFreeAddrsOutsideEphemeralRange(t *testing.T) {
	addrs := FreeAddrs(t, 50)
	lo, hi := fixedPortRange()
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
		_, ps, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := strconv.Atoi(ps)
		if hi > lo && (p < lo || p >= hi) {
			t.Fatalf("port %d outside [%d, %d)", p, lo, hi)
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("bind %s: %v", a, err)
		}
		l.Close()
	}
}
