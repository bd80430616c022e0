package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The queen server the bench talks to: built and started as a child
// process (or one already running), its health and its shutdown.

// queenSystem talks to a queen server over its HTTP API only.
type queenSystem struct {
	cfg     *config
	sys     string   // sysQueen or sysQueenInterval
	base    string   // the first node: configure, health, latency producer
	bases   []string // all nodes given; producers and consumers are spread over them
	rr      atomic.Int64
	client  *http.Client
	version string

	// Set when this program started the server.
	cmd     *exec.Cmd
	tmp     string
	logPath string
	exited  chan struct{}
	waitErr error
	failed  atomic.Bool

	consQueue string
}

func newHTTPClient() *http.Client {
	tr := &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		WriteBufferSize:     64 << 10,
		ReadBufferSize:      64 << 10,
	}
	return &http.Client{Transport: tr}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func newQueenSystem(ctx context.Context, cfg *config, sys string) (*queenSystem, error) {
	q := &queenSystem{cfg: cfg, sys: sys, client: newHTTPClient()}
	if cfg.queenURL != "" {
		for u := range strings.SplitSeq(cfg.queenURL, ",") {
			if u = strings.TrimRight(strings.TrimSpace(u), "/"); u != "" {
				q.bases = append(q.bases, u)
			}
		}
		if len(q.bases) == 0 {
			return nil, errors.New("-queen-url: no URL given")
		}
		for i := len(q.bases) - 1; i >= 0; i-- {
			q.base = q.bases[i]
			if err := q.waitHealthy(ctx, 10*time.Second); err != nil {
				return nil, err
			}
		}
		return q, nil
	}
	if err := q.buildAndStart(ctx); err != nil {
		q.close()
		return nil, err
	}
	return q, nil
}

func (q *queenSystem) buildAndStart(ctx context.Context) error {
	src, err := filepath.Abs(q.cfg.queenSrc)
	if err != nil {
		return fmt.Errorf("queen source dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(src, "cmd", "queen")); err != nil {
		return fmt.Errorf("no queen command to build in %s (want %s/cmd/queen): %w", src, src, err)
	}
	q.tmp, err = os.MkdirTemp(q.cfg.tmpDir, "bench-queen-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	bin := filepath.Join(q.tmp, "queen")
	if q.cfg.queenBin != "" {
		bin = q.cfg.queenBin
	} else {
		t := time.Now()
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/queen")
		build.Dir = src
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/queen in %s: %w\n%s", src, err, bytes.TrimSpace(out))
		}
		slog.Info("built queen", "bin", bin, "took", time.Since(t).Round(time.Millisecond))
	}

	httpPort, err := freePort()
	if err != nil {
		return err
	}
	raftPort, err := freePort()
	if err != nil {
		return err
	}
	dataDir := filepath.Join(q.tmp, "data")
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	q.logPath = filepath.Join(q.tmp, "queen.log")
	logf, err := os.Create(q.logPath)
	if err != nil {
		return fmt.Errorf("queen log: %w", err)
	}
	defer logf.Close() // the child has its own copy of the descriptor
	httpAddr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(),
		"QUEEN_HTTP_ADDR="+httpAddr,
		fmt.Sprintf("QUEEN_RAFT_ADDR=127.0.0.1:%d", raftPort),
		"QUEEN_DATA_DIR="+dataDir,
		"QUEEN_FSYNC="+q.fsyncMode(),
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If this process dies, the server goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s serve: %w", bin, err)
	}
	q.cmd = cmd
	q.exited = make(chan struct{})
	go func() {
		q.waitErr = cmd.Wait()
		close(q.exited)
	}()
	q.base = "http://" + httpAddr
	q.bases = []string{q.base}
	if err := q.waitHealthy(ctx, q.cfg.queenStartTimeout); err != nil {
		return fmt.Errorf("%w\nlast lines of %s:\n%s", err, q.logPath, tailFile(q.logPath, 20))
	}
	slog.Info("queen is up", "url", q.base, "pid", cmd.Process.Pid, "version", q.version, "data", dataDir)
	return nil
}

func (q *queenSystem) waitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		if q.exited != nil {
			select {
			case <-q.exited:
				return fmt.Errorf("queen exited before it was healthy: %v", q.waitErr)
			default:
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, q.base+"/health", nil)
		if err != nil {
			cancel()
			return fmt.Errorf("health request: %w", err)
		}
		resp, err := q.client.Do(req)
		if err == nil {
			var buf bytes.Buffer
			_, _ = buf.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				cancel()
				var h struct {
					Status  string `json:"status"`
					Role    string `json:"role"`
					Version string `json:"version"`
				}
				if err := json.Unmarshal(buf.Bytes(), &h); err != nil {
					slog.Warn("GET /health: reply is not the documented JSON", "body", trunc(buf.Bytes(), 200), "err", err)
				}
				q.version = strings.TrimSpace(h.Version + " " + h.Role)
				return nil
			}
			last = fmt.Sprintf("GET /health answered %d: %s", resp.StatusCode, trunc(buf.Bytes(), 200))
		} else {
			last = err.Error()
		}
		cancel()
		if time.Now().After(deadline) {
			return fmt.Errorf("queen at %s not healthy after %s: %s", q.base, timeout, last)
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return ctx.Err()
		}
	}
}

func (q *queenSystem) name() string { return q.sys }

// fsyncMode is the QUEEN_FSYNC the server is started with.
func (q *queenSystem) fsyncMode() string {
	if q.sys == sysQueenInterval {
		return "interval"
	}
	return "always"
}

func (q *queenSystem) serverPID() int {
	if q.cmd != nil && q.cmd.Process != nil {
		return q.cmd.Process.Pid
	}
	return 0
}

func (q *queenSystem) close() error {
	var err error
	if q.cmd != nil && q.cmd.Process != nil {
		select {
		case <-q.exited:
			err = fmt.Errorf("queen had exited during the run: %v", q.waitErr)
			q.failed.Store(true)
		default:
			_ = q.cmd.Process.Signal(syscall.SIGTERM)
			tm := time.NewTimer(20 * time.Second)
			select {
			case <-q.exited:
				if q.waitErr != nil {
					err = fmt.Errorf("queen stopped after SIGTERM with: %v", q.waitErr)
				}
			case <-tm.C:
				_ = q.cmd.Process.Kill()
				<-q.exited
				err = errors.New("queen did not stop within 20s of SIGTERM; killed")
			}
			tm.Stop()
		}
	}
	if q.logPath != "" && (err != nil || q.failed.Load()) {
		fmt.Fprintf(os.Stderr, "last lines of %s:\n%s\n", q.logPath, tailFile(q.logPath, 30))
	}
	if q.tmp != "" {
		if q.cfg.keep {
			fmt.Fprintf(os.Stderr, "queen: data and log kept in %s\n", q.tmp)
		} else if rerr := os.RemoveAll(q.tmp); rerr != nil && err == nil {
			err = fmt.Errorf("remove %s: %w", q.tmp, rerr)
		}
	}
	return err
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
