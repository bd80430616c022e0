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
	"strconv"
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
	bin, remove, err := testkit.BuildQueen()
	if err != nil {
		fmt.Fprintln(os.Stderr, "build queen:", err)
		os.Exit(1)
	}
	queenBin = bin
	code := m.Run()
	remove()
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

func getHealth(n node) (int, testkit.Health) {
	code, h, _, _ := testkit.GetHealth(httpc, n.base(), 2*time.Second)
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

	node testkit.Node
}

func (p *proc) name() string { return p.id }
func (p *proc) base() string { return "http://" + p.httpAddr }

func (p *proc) queen() *testkit.Queen { return p.node.Queen() }

func (p *proc) alive() bool { return p.node.Alive() }

// start starts the process on its ports and data with p.env as it is now.
func (p *proc) start() {
	p.t.Helper()
	p.node.Start(p.t, func() *testkit.Queen {
		return &testkit.Queen{Bin: queenBin, Name: p.id, HTTPAddr: p.httpAddr, RaftAddr: p.raftAddr,
			DataDir: p.dataDir, LogPath: p.logPath}
	}, append([]string{"QUEEN_NODE_ID=" + p.id, "QUEEN_LOG_LEVEL=warn"}, p.env...))
}

func (p *proc) signal(sig syscall.Signal) { p.node.Signal(p.t, p.id, sig, 15*time.Second) }

func (p *proc) kill() { p.signal(syscall.SIGKILL) }
func (p *proc) term() { p.signal(syscall.SIGTERM) }

func (p *proc) logTail() string { return testkit.LogTail(p.logPath, 6000) }

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

// startProcCluster starts size processes bootstrapping one cluster, each
// with env added to its environment.
func startProcCluster(t *testing.T, size int, env ...string) *procCluster {
	t.Helper()
	envs := make([][]string, size)
	for i := range envs {
		envs[i] = env
	}
	return startProcClusterEnv(t, envs)
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
