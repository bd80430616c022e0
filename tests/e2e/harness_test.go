package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
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

	"github.com/queen-mq/queen/internal/testkit"
)

// queenBin is the server binary built once by TestMain.
var queenBin string

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests mostly wait (servers starting, leases expiring, long polls),
	// not compute: run more of them at once than GOMAXPROCS unless -parallel
	// was given.
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		flag.Set("test.parallel", "8")
	}
	dir, err := os.MkdirTemp("", "queen-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
		os.Exit(1)
	}
	queenBin = filepath.Join(dir, "queen")
	build := exec.Command("go", "build", "-o", queenBin, "github.com/queen-mq/queen/cmd/queen")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	start := time.Now()
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go build ./cmd/queen failed:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built %s in %v\n", queenBin, time.Since(start).Round(time.Millisecond))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type serverConfig struct {
	env    map[string]string
	noWait bool
	roots  *x509.CertPool // HTTPS: the server's certificate authority
}

type serverOpt func(*serverConfig)

// noReadyWait makes startServer and Restart return as soon as the process is
// started, for tests that watch the start-up themselves.
func noReadyWait() serverOpt { return func(c *serverConfig) { c.noWait = true } }

// withTLS serves HTTPS from certFile and keyFile; the test's client trusts
// roots.
func withTLS(certFile, keyFile string, roots *x509.CertPool) serverOpt {
	return func(c *serverConfig) {
		c.env["QUEEN_TLS_CERT_FILE"], c.env["QUEEN_TLS_KEY_FILE"], c.roots = certFile, keyFile, roots
	}
}

// withEnv sets an environment variable of the server process.
func withEnv(k, v string) serverOpt { return func(c *serverConfig) { c.env[k] = v } }

// server is one `queen serve` child process with its own data directory.
type server struct {
	t        *testing.T
	name     string
	env      map[string]string
	noWait   bool
	dataDir  string
	logPath  string
	httpAddr string
	raftAddr string
	base     string
	hc       *http.Client

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	starts  int
}

// startServer starts a server on free ports with a fresh data directory and
// waits until GET /health answers 200. It is stopped (SIGTERM, SIGKILL after
// 10 s) when the test ends; on failure its output is printed.
func startServer(t *testing.T, opts ...serverOpt) *server {
	t.Helper()
	cfg := serverConfig{env: map[string]string{}}
	for _, o := range opts {
		o(&cfg)
	}
	addrs := freeAddrs(t, 2)
	s := &server{
		t:        t,
		name:     t.Name(),
		env:      cfg.env,
		noWait:   cfg.noWait,
		dataDir:  t.TempDir(),
		logPath:  filepath.Join(t.TempDir(), "queen.log"),
		httpAddr: addrs[0],
		raftAddr: addrs[1],
	}
	s.base = "http://" + s.httpAddr
	tr := &http.Transport{
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	if cfg.roots != nil {
		s.base = "https://" + s.httpAddr
		tr.TLSClientConfig = &tls.Config{RootCAs: cfg.roots}
	}
	s.hc = &http.Client{
		Timeout:   20 * time.Second, // the longest request here is a 5 s long poll
		Transport: tr,
	}
	// Registered after the TempDirs, so it runs before they are removed.
	t.Cleanup(s.cleanup)
	s.start(t)
	return s
}

func (s *server) start(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		t.Fatalf("server %s: start while running", s.name)
	}
	s.starts++
	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.mu.Unlock()
		t.Fatalf("open server log: %v", err)
	}
	fmt.Fprintf(f, "=== e2e: start #%d of %s at %s (http %s, raft %s, data %s)\n",
		s.starts, s.name, time.Now().UTC().Format(time.RFC3339Nano), s.httpAddr, s.raftAddr, s.dataDir)
	cmd := exec.Command(queenBin, "serve")
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUEEN_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"QUEEN_HTTP_ADDR="+s.httpAddr,
		"QUEEN_RAFT_ADDR="+s.raftAddr,
		"QUEEN_DATA_DIR="+s.dataDir,
	)
	for k, v := range s.env {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		s.mu.Unlock()
		t.Fatalf("start %s: %v", queenBin, err)
	}
	done := make(chan struct{})
	s.cmd, s.done, s.waitErr = cmd, done, nil
	go func() {
		err := cmd.Wait()
		f.Close()
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
		close(done)
	}()
	s.mu.Unlock()
	if s.noWait {
		return
	}

	// Ready = GET /health 200 with role "leader": every server here is a
	// single voter, which serves only as the leader. (/health alone is not
	// enough: it has been seen answering 200 a few ms before the node accepts
	// writes; TestHealthMeansReady covers that.)
	err = checkFor(20*time.Second, 20*time.Millisecond, func() error {
		select {
		case <-done:
			return errExited
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.base+"/health", nil)
		resp, err := s.hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var h struct {
			Role string `json:"role"`
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("GET /health: %d %s", resp.StatusCode, b)
		}
		if json.Unmarshal(b, &h) != nil || h.Role != "leader" {
			return fmt.Errorf("GET /health: 200 but not yet leader: %s", b)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, errExited) {
			<-done
			t.Fatalf("server %s exited before it was healthy (%v); log:\n%s", s.name, s.exitErr(), s.logTail())
		}
		t.Fatalf("server %s not healthy after 20 s: %v; log:\n%s", s.name, err, s.logTail())
	}
}

var errExited = errors.New("server process exited")

func (s *server) exitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitErr
}

// running reports whether the process is up.
func (s *server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Stop sends SIGTERM and waits for the exit (SIGKILL after 10 s). It returns
// the process's exit error (nil for a clean exit).
func (s *server) Stop() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Signal(syscall.SIGTERM)
	sent := time.Now()
	var err error
	select {
	case <-done:
		err = s.exitErr()
		if d := time.Since(sent); d > 3*time.Second {
			s.t.Logf("server %s took %v to exit after SIGTERM", s.name, d.Round(time.Millisecond))
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		err = fmt.Errorf("did not exit within 10 s of SIGTERM; killed")
	}
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
	return err
}

// Kill ends the process with SIGKILL (a crash) and waits for it.
func (s *server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
}

// Restart starts the server again on the same ports and data directory (after
// Stop or Kill) and waits until it is healthy.
func (s *server) Restart(t *testing.T) {
	t.Helper()
	if s.running() {
		t.Fatalf("Restart while the server is running; Stop or Kill it first")
	}
	s.start(t)
}

func (s *server) cleanup() {
	if s.running() {
		if err := s.Stop(); err != nil {
			s.t.Logf("server %s: stop: %v", s.name, err)
		}
	}
	if s.t.Failed() {
		s.t.Logf("server %s log (%s):\n%s", s.name, s.logPath, s.logTail())
	}
	s.hc.CloseIdleConnections()
}

// logTail returns the end of the server's output.
func (s *server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	const max = 32 << 10
	if len(b) > max {
		b = append([]byte("…(truncated)…\n"), b[len(b)-max:]...)
	}
	return string(b)
}

// checkFor and freeAddrs are the shared helpers of internal/testkit.
func checkFor(total, interval time.Duration, f func() error) error {
	return testkit.CheckFor(total, interval, f)
}

func freeAddrs(t *testing.T, n int) []string { return testkit.FreeAddrs(t, n) }
