package testkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Queen is one `queen serve` process of a test. It keeps its ports, data
// directory and log across stops, kills and restarts. Set the fields before
// the first Start; Env may change between restarts.
type Queen struct {
	Bin      string // the binary, from BuildQueen
	Name     string // names the process in its log and in errors
	HTTPAddr string
	RaftAddr string
	DataDir  string
	LogPath  string // output of every start, appended
	// Env is given to the process after QUEEN_HTTP_ADDR, QUEEN_RAFT_ADDR
	// and QUEEN_DATA_DIR (a later entry wins over an earlier one). No other
	// QUEEN_ variable of the test's own environment reaches the process.
	Env []string
	// Banner, when set, is the log line written before start number n
	// (from 1); otherwise "=== start <Name> at <time>".
	Banner func(n int) string

	mu     sync.Mutex
	proc   *Process // running: started, not stopped or killed through q
	last   *Process // the latest started, running or not
	starts int
}

// NewQueen returns a Queen named name on two free loopback ports, with a
// new data directory and its log in another new directory of the test. It
// is not started.
func NewQueen(t testing.TB, bin, name string) *Queen {
	t.Helper()
	addrs := FreeAddrs(t, 2)
	return &Queen{Bin: bin, Name: name, HTTPAddr: addrs[0], RaftAddr: addrs[1],
		DataDir: t.TempDir(), LogPath: filepath.Join(t.TempDir(), "queen.log")}
}

// URL is the base of the HTTP API, http://host:port.
func (q *Queen) URL() string { return "http://" + q.HTTPAddr }

// Start starts the process without waiting for it to serve. It fails while
// the process of an earlier start is alive.
func (q *Queen) Start() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.proc != nil && !q.proc.Exited() {
		return fmt.Errorf("queen %s: start while running; Stop or Kill9 it first", q.Name)
	}
	q.starts++
	banner := fmt.Sprintf("=== start %s at %s", q.Name, time.Now().UTC().Format(time.RFC3339Nano))
	if q.Banner != nil {
		banner = q.Banner(q.starts)
	}
	cmd := exec.Command(q.Bin, "serve")
	cmd.Env = append(QueenEnv(), "QUEEN_HTTP_ADDR="+q.HTTPAddr, "QUEEN_RAFT_ADDR="+q.RaftAddr, "QUEEN_DATA_DIR="+q.DataDir)
	cmd.Env = append(cmd.Env, q.Env...)
	p, err := StartProcess(cmd, q.LogPath, banner)
	if err != nil {
		return fmt.Errorf("queen %s: %w", q.Name, err)
	}
	q.proc, q.last = p, p
	return nil
}

// Restart is Start after a Stop or Kill9: the same ports and data.
func (q *Queen) Restart() error { return q.Start() }

// QueenEnv is the test's environment without its QUEEN_ variables: a
// server of a test is configured only by what the test gives it.
func QueenEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUEEN_") {
			env = append(env, kv)
		}
	}
	return env
}

func (q *Queen) process() *Process {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.proc
}

// Running reports whether the process was started and not since stopped or
// killed through q (it may have exited by itself).
func (q *Queen) Running() bool { return q.process() != nil }

// Alive reports whether the process is started and has not exited.
func (q *Queen) Alive() bool {
	p := q.process()
	return p != nil && !p.Exited()
}

// Done is closed when the current process exits; nil when none is running.
func (q *Queen) Done() <-chan struct{} {
	if p := q.process(); p != nil {
		return p.Done()
	}
	return nil
}

// ExitErr is the exit error of the latest process started (nil while it
// runs, and for a clean exit).
func (q *Queen) ExitErr() error {
	q.mu.Lock()
	p := q.last
	q.mu.Unlock()
	if p != nil {
		return p.ExitErr()
	}
	return nil
}

// Pid is the current process's id; 0 when none is running.
func (q *Queen) Pid() int {
	if p := q.process(); p != nil {
		return p.Pid()
	}
	return 0
}

// Signal sends sig and waits up to within for the exit (then SIGKILL, and
// an error says so). Without a running process it does nothing.
func (q *Queen) Signal(sig os.Signal, within time.Duration) error {
	p := q.process()
	if p == nil {
		return nil
	}
	err := p.Signal(sig, within)
	q.forget(p)
	return err
}

// Stop ends the process with SIGTERM, SIGKILL after within, and returns its
// exit error (nil for a clean exit) or the error that it had to be killed.
func (q *Queen) Stop(within time.Duration) error {
	p := q.process()
	if p == nil {
		return nil
	}
	err := p.Signal(syscall.SIGTERM, within)
	q.forget(p)
	if err != nil {
		return err
	}
	return p.ExitErr()
}

// Kill9 ends the process with SIGKILL (a crash) and waits for it.
func (q *Queen) Kill9() {
	p := q.process()
	if p == nil {
		return
	}
	p.Kill9()
	q.forget(p)
}

func (q *Queen) forget(p *Process) {
	q.mu.Lock()
	if q.proc == p {
		q.proc = nil
	}
	q.mu.Unlock()
}

// Log is the end of the process's output (of every start), at most max
// bytes.
func (q *Queen) Log(max int) string { return LogTail(q.LogPath, max) }

// LogTail is the last max bytes of the file at path, marked when cut.
func LogTail(path string, max int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > max {
		b = append([]byte("…(truncated)…\n"), b[len(b)-max:]...)
	}
	return string(b)
}

// ErrExited is returned by WaitLeader when the process exits first.
var ErrExited = errors.New("server process exited")

// WaitLeader polls GET base/health every 20 ms (each request given a
// second) until it answers 200 with role "leader", for at most within. It
// returns ErrExited at once when the process exits, else the last failure.
// base is the URL the client reaches the server at (https for TLS).
func (q *Queen) WaitLeader(hc *http.Client, base string, within time.Duration) error {
	done := q.Done()
	return CheckFor(within, 20*time.Millisecond, func() error {
		select {
		case <-done:
			return ErrExited
		default:
		}
		code, h, b, err := GetHealth(hc, base, time.Second)
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("GET /health: %d %s", code, b)
		}
		if h.Role != "leader" {
			return fmt.Errorf("GET /health: 200 but not yet leader: %s", b)
		}
		return nil
	})
}

// Health is the answer of GET /health.
type Health struct {
	Status string `json:"status"`
	Role   string `json:"role"`
	Node   string `json:"node"`
}

// GetHealth asks base's GET /health, giving the request timeout (0: only
// the client's own). code is 0 and err set when no answer came; h is zero
// when the body is not a health object.
func GetHealth(hc *http.Client, base string, timeout time.Duration) (code int, h Health, body []byte, err error) {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/health", nil)
	if err != nil {
		return 0, h, nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, h, nil, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	if err != nil {
		return 0, h, nil, err
	}
	if json.Unmarshal(body, &h) != nil {
		h = Health{}
	}
	return resp.StatusCode, h, body, nil
}
