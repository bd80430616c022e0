// Package cluster tests three-node clusters end to end: real processes
// killed with SIGKILL, in-process nodes behind a fault-injecting TCP proxy,
// linearizability checks (porcupine) of KV compare-and-set and of
// per-partition push/pop histories under both faults, and snapshot
// catch-up, also of a store of a million messages.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/testkit"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/httpapi"
)

var queenBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "queen-cluster-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	queenBin = filepath.Join(dir, "queen")
	out, err := exec.Command("go", "build", "-o", queenBin, "github.com/queen-mq/queen/cmd/queen").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build queen: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// trials is the number of fault trials: def normally, short under -short,
// QUEEN_TRIALS when set.
func trials(def, short int) int {
	if v, err := strconv.Atoi(os.Getenv("QUEEN_TRIALS")); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return short
	}
	return def
}

var httpc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}}

// do sends a JSON request; status 0 and an error when no answer came. A
// json.RawMessage body is sent as it is.
func do(ctx context.Context, method, url string, body any) (int, []byte, error) {
	var rd io.Reader
	if raw, ok := body.(json.RawMessage); ok {
		rd = bytes.NewReader(raw)
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

func doT(method, url string, body any, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return do(ctx, method, url, body)
}

// node is what the checks need of a member, process or in-process.
type node interface {
	name() string
	base() string // http://host:port
	alive() bool
}

type clusterView struct {
	Leader  string `json:"leader"`
	Members []struct {
		ID        string              `json:"id"`
		Suffrage  string              `json:"suffrage"`
		Reachable bool                `json:"reachable"`
		Status    *cluster.NodeStatus `json:"status"`
	} `json:"members"`
}

func getCluster(n node, checksum bool) (*clusterView, error) {
	code, b, err := doT("GET", n.base()+"/api/v1/cluster?checksum="+strconv.FormatBool(checksum), nil, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("GET /api/v1/cluster: %d %s", code, b)
	}
	var v clusterView
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

type health struct {
	Status string `json:"status"`
	Role   string `json:"role"`
	Node   string `json:"node"`
}

func getHealth(n node) (int, health) {
	code, b, err := doT("GET", n.base()+"/health", nil, 2*time.Second)
	var h health
	if err == nil {
		json.Unmarshal(b, &h)
	}
	return code, h
}

// waitServing waits until every live node answers /health 200 and exactly
// one of them is the leader; it returns the leader.
func waitServing(t testing.TB, nodes []node, within time.Duration) node {
	t.Helper()
	var leader node
	err := checkFor(within, 20*time.Millisecond, func() error {
		leader = nil
		for _, n := range nodes {
			if !n.alive() {
				continue
			}
			code, h := getHealth(n)
			if code != 200 {
				return fmt.Errorf("%s: /health %d %+v", n.name(), code, h)
			}
			if h.Role == "leader" {
				if leader != nil {
					return fmt.Errorf("two leaders: %s and %s", leader.name(), n.name())
				}
				leader = n
			}
		}
		if leader == nil {
			return errors.New("no leader")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("cluster not serving after %v: %v", within, err)
	}
	return leader
}

// waitConverged waits until every live node reports the same applied index
// and the same state checksum, and returns the checksum.
func waitConverged(t testing.TB, nodes []node, within time.Duration) string {
	t.Helper()
	var sum string
	err := checkFor(within, 100*time.Millisecond, func() error {
		sums := map[string]string{}
		applied := map[string]uint64{}
		for _, n := range nodes {
			if !n.alive() {
				continue
			}
			v, err := getCluster(n, true)
			if err != nil {
				return err
			}
			for _, m := range v.Members {
				if m.Status == nil || m.Status.ID != n.name() {
					continue
				}
				sums[n.name()], applied[n.name()] = m.Status.Checksum, m.Status.AppliedIndex
			}
		}
		sum = ""
		var idx uint64
		for name, s := range sums {
			if sum == "" {
				sum, idx = s, applied[name]
			}
			if s != sum || applied[name] != idx || s == "" {
				return fmt.Errorf("nodes differ: checksums %v, applied %v", sums, applied)
			}
		}
		if len(sums) == 0 {
			return errors.New("no node answered")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("state did not converge within %v: %v", within, err)
	}
	return sum
}

// ---- real processes ----

type proc struct {
	t        testing.TB
	id       string
	httpAddr string
	raftAddr string
	dataDir  string
	logPath  string
	env      []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) name() string { return p.id }
func (p *proc) base() string { return "http://" + p.httpAddr }
func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) start() {
	p.t.Helper()
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	fmt.Fprintf(f, "=== start %s at %s\n", p.id, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(queenBin, "serve")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUEEN_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(append(env, "QUEEN_NODE_ID="+p.id, "QUEEN_HTTP_ADDR="+p.httpAddr, "QUEEN_RAFT_ADDR="+p.raftAddr,
		"QUEEN_DATA_DIR="+p.dataDir, "QUEEN_LOG_LEVEL=warn"), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		p.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
		p.t.Errorf("%s did not exit within 15 s of %v", p.id, sig)
	}
}

func (p *proc) kill() { p.signal(syscall.SIGKILL) }
func (p *proc) term() { p.signal(syscall.SIGTERM) }

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

type procCluster struct {
	t     testing.TB
	procs []*proc
}

func (c *procCluster) nodes() []node {
	out := make([]node, len(c.procs))
	for i, p := range c.procs {
		out[i] = p
	}
	return out
}

func (c *procCluster) byName(n node) *proc {
	for _, p := range c.procs {
		if p.id == n.name() {
			return p
		}
	}
	return nil
}

// startProcCluster starts size processes bootstrapping one cluster.
func startProcCluster(t *testing.T, size int, env ...string) *procCluster {
	t.Helper()
	c := &procCluster{t: t}
	addrs := freeAddrs(t, 2*size)
	var peers []string
	for i := 0; i < size; i++ {
		p := &proc{t: t, id: fmt.Sprintf("n%d", i+1), httpAddr: addrs[2*i], raftAddr: addrs[2*i+1],
			dataDir: filepath.Join(t.TempDir(), "data"), env: env}
		p.logPath = filepath.Join(filepath.Dir(p.dataDir), "queen.log")
		peers = append(peers, p.id+"="+p.raftAddr)
		c.procs = append(c.procs, p)
	}
	for _, p := range c.procs {
		p.env = append(p.env, "QUEEN_PEERS="+strings.Join(peers, ","))
		p.start()
	}
	t.Cleanup(func() {
		for _, p := range c.procs {
			if p.alive() {
				p.kill()
			}
		}
		if t.Failed() {
			for _, p := range c.procs {
				t.Logf("log of %s:\n%s", p.id, p.logTail())
			}
		}
	})
	waitServing(t, c.nodes(), 30*time.Second)
	return c
}

// ---- in-process nodes ----

type inproc struct {
	id       string
	cfg      broker.Config
	httpAddr string
	b        *broker.Broker
	srv      *http.Server
	up       bool
}

func (n *inproc) name() string { return n.id }
func (n *inproc) base() string { return "http://" + n.httpAddr }
func (n *inproc) alive() bool  { return n.up }

func (n *inproc) open(t testing.TB) {
	t.Helper()
	b, err := broker.Open(n.cfg)
	if err != nil {
		t.Fatalf("open %s: %v", n.id, err)
	}
	ln, err := net.Listen("tcp", n.httpAddr)
	if err != nil {
		b.Close()
		t.Fatalf("listen %s: %v", n.httpAddr, err)
	}
	n.b = b
	n.srv = &http.Server{Handler: httpapi.New(b, httpapi.Config{Logger: n.cfg.Logger})}
	go n.srv.Serve(ln)
	n.up = true
}

func (n *inproc) close() {
	if !n.up {
		return
	}
	n.up = false
	n.b.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if n.srv.Shutdown(ctx) != nil {
		n.srv.Close()
	}
	n.b.Close()
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() && os.Getenv("QUEEN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// ---- workload helpers ----

type pushItem struct {
	Queue         string         `json:"queue"`
	Partition     string         `json:"partition"`
	TransactionID string         `json:"transactionId"`
	Payload       map[string]any `json:"payload"`
}

type pushReply []struct {
	Status        string `json:"status"`
	TransactionID string `json:"transaction_id"`
	PartitionID   string `json:"partition_id"`
	Offset        uint64 `json:"offset"`
}

type message struct {
	TransactionID string `json:"transactionId"`
	Partition     string `json:"partition"`
	PartitionID   string `json:"partitionId"`
	Offset        uint64 `json:"offset"`
	LeaseID       string `json:"leaseId"`
}

type popReply struct {
	LeaseID  string    `json:"leaseId"`
	Messages []message `json:"messages"`
}

// drain pops every message a group can still get from queue (autoAck), on
// random live nodes, until f says it has seen enough or within passes.
func drain(t testing.TB, nodes []node, queue, group, mode string, within time.Duration, enough func(seen []message) bool) []message {
	t.Helper()
	var seen []message
	deadline := time.Now().Add(within)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	for {
		n := nodes[rng.Intn(len(nodes))]
		if !n.alive() {
			continue
		}
		url := fmt.Sprintf("%s/api/v1/pop/queue/%s?consumerGroup=%s&subscriptionMode=%s&autoAck=true&batch=1000&partitions=100", n.base(), queue, group, mode)
		code, b, err := doT("GET", url, nil, 10*time.Second)
		switch {
		case err != nil || code >= 500:
			// Try again (another node, or after an election).
		case code == 204:
			if enough(seen) || time.Now().After(deadline) {
				return seen
			}
			time.Sleep(100 * time.Millisecond)
		case code == 200:
			var r popReply
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("pop reply %s: %v", b, err)
			}
			seen = append(seen, r.Messages...)
			continue
		default:
			t.Fatalf("drain pop: %d %s", code, b)
		}
		if time.Now().After(deadline) {
			return seen
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkFor and freeAddrs are the shared helpers of internal/testkit.
func checkFor(total, interval time.Duration, f func() error) error {
	return testkit.CheckFor(total, interval, f)
}

// others lists the nodes except x.
func others(nodes []node, x node) []node {
	var out []node
	for _, n := range nodes {
		if n != x {
			out = append(out, n)
		}
	}
	return out
}

func freeAddrs(t testing.TB, n int) []string { return testkit.FreeAddrs(t, n) }
