package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
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
	start := time.Now()
	bin, remove, err := testkit.BuildQueen()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	queenBin = bin
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built %s in %v\n", queenBin, time.Since(start).Round(time.Millisecond))
	}
	code := m.Run()
	remove()
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
	dataDir  string
	logPath  string
	httpAddr string
	raftAddr string
	base     string
	hc       *http.Client
	noWait   bool
	q        *testkit.Queen
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
	q := testkit.NewQueen(t, queenBin, t.Name())
	for k, v := range cfg.env {
		q.Env = append(q.Env, k+"="+v)
	}
	q.Banner = func(n int) string {
		return fmt.Sprintf("=== e2e: start #%d of %s at %s (http %s, raft %s, data %s)",
			n, q.Name, time.Now().UTC().Format(time.RFC3339Nano), q.HTTPAddr, q.RaftAddr, q.DataDir)
	}
	s := &server{
		t:        t,
		name:     q.Name,
		dataDir:  q.DataDir,
		logPath:  q.LogPath,
		httpAddr: q.HTTPAddr,
		raftAddr: q.RaftAddr,
		noWait:   cfg.noWait,
		q:        q,
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
	if err := s.q.Start(); err != nil {
		t.Fatalf("server %s: %v", s.name, err)
	}
	if s.noWait {
		return
	}
	// Ready = GET /health 200 with role "leader": every server here is a
	// single voter, which serves only as the leader. (/health alone is not
	// enough: it has been seen answering 200 a few ms before the node accepts
	// writes; TestHealthMeansReady covers that.)
	if err := s.q.WaitLeader(s.hc, s.base, 20*time.Second); err != nil {
		if errors.Is(err, testkit.ErrExited) {
			t.Fatalf("server %s exited before it was healthy (%v); log:\n%s", s.name, s.q.ExitErr(), s.logTail())
		}
		t.Fatalf("server %s not healthy after 20 s: %v; log:\n%s", s.name, err, s.logTail())
	}
}

// running reports whether the process was started and not since stopped or
// killed.
func (s *server) running() bool { return s.q.Running() }

// pid is the server process's id.
func (s *server) pid() int { return s.q.Pid() }

// Stop sends SIGTERM and waits for the exit (SIGKILL after 10 s). It returns
// the process's exit error (nil for a clean exit).
func (s *server) Stop() error {
	if !s.running() {
		return nil
	}
	sent := time.Now()
	if err := s.q.Signal(syscall.SIGTERM, 10*time.Second); err != nil {
		return err
	}
	if d := time.Since(sent); d > 3*time.Second {
		s.t.Logf("server %s took %v to exit after SIGTERM", s.name, d.Round(time.Millisecond))
	}
	return s.q.ExitErr()
}

// Kill ends the process with SIGKILL (a crash) and waits for it.
func (s *server) Kill() { s.q.Kill9() }

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
func (s *server) logTail() string { return s.q.Log(32 << 10) }

// checkFor and freeAddrs are the shared helpers of internal/testkit.
func checkFor(total, interval time.Duration, f func() error) error {
	return testkit.CheckFor(total, interval, f)
}

func freeAddrs(t *testing.T, n int) []string { return testkit.FreeAddrs(t, n) }
