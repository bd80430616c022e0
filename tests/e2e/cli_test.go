package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runQueen runs the binary to its end and returns its output and exit code.
func runQueen(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(queenBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out.String(), errb.String(), ee.ExitCode()
		} else if err != nil {
			t.Fatalf("queen %v: %v", args, err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("queen %v did not end within 30 s; stderr:\n%s", args, errb.String())
	}
	return out.String(), errb.String(), 0
}

// The command line answers help and version questions with exit 0.
func TestCLIHelpAndVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		out, errOut, code := runQueen(t, nil, args...)
		if code != 0 {
			t.Errorf("queen %v: exit %d; stderr:\n%s", args, code, errOut)
		}
		for _, want := range []string{"serve", "dev-cluster", "version", "-base-port"} {
			if !strings.Contains(out, want) {
				t.Errorf("queen %v does not list %q:\n%s", args, want, out)
			}
		}
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, errOut, code := runQueen(t, nil, args...)
		if code != 0 || !strings.HasPrefix(out, "queen ") || len(strings.TrimSpace(out)) <= len("queen ") {
			t.Errorf("queen %v: exit %d, stdout %q, stderr %q; want exit 0 and \"queen <version>\"", args, code, out, errOut)
		}
	}
	for _, c := range []struct {
		args  []string
		wants []string
	}{
		{[]string{"dev-cluster", "--help"}, []string{"-base-port", "-data", "Kill one"}},
		{[]string{"dev-cluster", "-h"}, []string{"-base-port"}},
		{[]string{"serve", "--help"}, []string{"QUEEN_MEMORY_LIMIT", "QUEEN_DATA_DIR"}},
	} {
		out, errOut, code := runQueen(t, nil, c.args...)
		if code != 0 {
			t.Errorf("queen %v: exit %d; want 0; stderr:\n%s", c.args, code, errOut)
		}
		for _, want := range c.wants {
			if !strings.Contains(out+errOut, want) {
				t.Errorf("queen %v lacks %q:\n%s%s", c.args, want, out, errOut)
			}
		}
	}
	if _, errOut, code := runQueen(t, nil, "frobnicate"); code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) || !strings.Contains(errOut, "dev-cluster") {
		t.Errorf("queen frobnicate: exit %d, stderr:\n%s; want exit 2 naming the command and listing the commands", code, errOut)
	}
}

// A second queen on a data directory in use says another queen holds it.
func TestLockedDataDirNamesTheHolder(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	addrs := freeAddrs(t, 2)
	_, errOut, code := runQueen(t, []string{"QUEEN_DATA_DIR=" + s.dataDir, "QUEEN_HTTP_ADDR=" + addrs[0], "QUEEN_RAFT_ADDR=" + addrs[1]}, "serve")
	if code != 1 {
		t.Fatalf("second queen on %s: exit %d; want 1; stderr:\n%s", s.dataDir, code, errOut)
	}
	for _, want := range []string{"is in use: another queen process holds its lock", "QUEEN_DATA_DIR", s.dataDir} {
		if !strings.Contains(errOut, want) {
			t.Errorf("error lacks %q:\n%s", want, errOut)
		}
	}
	if !s.running() {
		t.Fatal("the first server stopped")
	}
}

// QUEEN_MEMORY_LIMIT reaches the store and the Go runtime (the start-up
// line reports what the store was opened with), unset it is 128MiB, the C
// allocator's arenas are capped unless MALLOC_ARENA_MAX says otherwise, and
// a bad value is refused.
func TestMemoryLimitSetting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ setting, arenas, want string }{
		{"256MiB", "", `msg="memory limit" limit=256MiB block_cache=8MiB memtable=32MiB memtables_max=4 retry_results=8MiB go_memory_limit=184MiB malloc_arenas=2`},
		{"", "", `msg="memory limit" limit=128MiB block_cache=4MiB memtable=16MiB memtables_max=4 retry_results=4MiB go_memory_limit=92MiB malloc_arenas=2`},
		{"", "3", `go_memory_limit=92MiB malloc_arenas="3 (MALLOC_ARENA_MAX)"`},
	} {
		opts := []serverOpt{withEnv("MALLOC_ARENA_MAX", c.arenas)}
		if c.setting != "" {
			opts = append(opts, withEnv("QUEEN_MEMORY_LIMIT", c.setting))
		}
		s := startServer(t, opts...)
		if log := s.logTail(); !strings.Contains(log, c.want) {
			t.Errorf("QUEEN_MEMORY_LIMIT=%q: start-up log lacks %s:\n%s", c.setting, c.want, log)
		}
	}
	for _, c := range []struct{ value, want string }{
		{"lots", `QUEEN_MEMORY_LIMIT / -memory-limit "lots": want a size such as 512MiB`},
		{"64MiB", "want at least 128MiB"},
	} {
		addrs := freeAddrs(t, 2)
		_, errOut, code := runQueen(t, []string{"QUEEN_MEMORY_LIMIT=" + c.value, "QUEEN_DATA_DIR=" + filepath.Join(t.TempDir(), "d"),
			"QUEEN_HTTP_ADDR=" + addrs[0], "QUEEN_RAFT_ADDR=" + addrs[1]}, "serve")
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("QUEEN_MEMORY_LIMIT=%s: exit %d, stderr:\n%s; want exit 1 with %q", c.value, code, errOut, c.want)
		}
	}
}
