package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// devCluster runs three nodes of this binary on 127.0.0.1 (HTTP 6632, 6642,
// 6652; raft 6633, 6643, 6653; data in DIR/n1..n3), prefixes their logs,
// and stops them all on Ctrl-C. Started again on the same data it resumes
// the same cluster.
func devCluster(args []string) error {
	fs := flag.NewFlagSet("dev-cluster", flag.ContinueOnError)
	dataDir := fs.String("data", "./data", "directory holding the nodes' data directories n1, n2, n3")
	basePort := fs.Int("base-port", 6632, "HTTP port of n1; node i uses base+10*(i-1) for HTTP and one more for raft")
	if err := fs.Parse(args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	type node struct {
		id, http, raft, dir string
		cmd                 *exec.Cmd
		done                chan struct{}
	}
	var nodes []*node
	var peers []string
	for i := 1; i <= 3; i++ {
		p := *basePort + 10*(i-1)
		n := &node{id: fmt.Sprintf("n%d", i), http: fmt.Sprintf("127.0.0.1:%d", p), raft: fmt.Sprintf("127.0.0.1:%d", p+1),
			dir: filepath.Join(*dataDir, fmt.Sprintf("n%d", i)), done: make(chan struct{})}
		nodes = append(nodes, n)
		peers = append(peers, n.id+"="+n.raft)
	}
	key, keyFrom, err := devClusterKey(*dataDir)
	if err != nil {
		return err
	}
	var outMu sync.Mutex
	prefix := func(id string, r io.Reader) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			outMu.Lock()
			fmt.Fprintf(os.Stderr, "[%s] %s\n", id, sc.Text())
			outMu.Unlock()
		}
	}
	// Ctrl-C reaches the whole process group; the nodes get SIGTERM from us.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stopAll := func() {
		for _, n := range nodes {
			if n.cmd != nil && n.cmd.Process != nil {
				n.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		for _, n := range nodes {
			if n.cmd == nil {
				continue
			}
			select {
			case <-n.done:
			case <-time.After(15 * time.Second):
				n.cmd.Process.Kill()
				<-n.done
			}
		}
	}
	for _, n := range nodes {
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			stopAll()
			return err
		}
		cmd := exec.Command(exe, "serve")
		cmd.Env = append(os.Environ(),
			"QUEEN_NODE_ID="+n.id, "QUEEN_HTTP_ADDR="+n.http, "QUEEN_RAFT_ADDR="+n.raft,
			"QUEEN_DATA_DIR="+n.dir, "QUEEN_PEERS="+strings.Join(peers, ","), "QUEEN_CLUSTER_KEY="+key)
		// Own process group: a Ctrl-C in the terminal reaches only this
		// parent, which then stops the nodes in order.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdout, _ := cmd.StdoutPipe()
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			stopAll()
			return fmt.Errorf("start %s: %w", n.id, err)
		}
		n.cmd = cmd
		var pipes sync.WaitGroup
		pipes.Add(2)
		go func() { defer pipes.Done(); prefix(n.id, stdout) }()
		go func() { defer pipes.Done(); prefix(n.id, stderr) }()
		go func() { pipes.Wait(); cmd.Wait(); close(n.done) }()
	}
	// Wait until every node answers healthy (or one exits).
	healthy := func(addr string) bool {
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		all := true
		for _, n := range nodes {
			select {
			case <-n.done:
				stopAll()
				return fmt.Errorf("node %s exited during start-up (see its log above)", n.id)
			default:
			}
			all = all && healthy(n.http)
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			stopAll()
			return fmt.Errorf("the nodes did not become healthy within a minute")
		}
		select {
		case <-sigs:
			stopAll()
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	outMu.Lock()
	fmt.Fprintf(os.Stderr, `
queen dev-cluster: three nodes are up (any node takes any request; followers forward to the leader)
  n1  http://%s  raft %s  data %s
  n2  http://%s  raft %s  data %s
  n3  http://%s  raft %s  data %s
  the nodes prove the cluster key of %s to each other on their raft ports
try:
  curl -s -XPOST http://%s/api/v1/push -d '{"items":[{"queue":"q","payload":{"hello":"world"}}]}'
  curl -s 'http://%s/api/v1/pop/queue/q?autoAck=true'
  curl -s http://%s/api/v1/cluster
Ctrl-C stops all three (the data stays; run again to resume).

`, nodes[0].http, nodes[0].raft, nodes[0].dir, nodes[1].http, nodes[1].raft, nodes[1].dir, nodes[2].http, nodes[2].raft, nodes[2].dir,
		keyFrom, nodes[0].http, nodes[1].http, nodes[2].http)
	outMu.Unlock()
	exited := make(chan string, len(nodes))
	for _, n := range nodes {
		go func() { <-n.done; exited <- n.id }()
	}
	select {
	case sig := <-sigs:
		fmt.Fprintf(os.Stderr, "queen dev-cluster: %s: stopping the nodes\n", sig)
		stopAll()
		return nil
	case id := <-exited:
		stopAll()
		return fmt.Errorf("node %s exited; stopped the others", id)
	}
}

// devClusterKey is the nodes' cluster key: QUEEN_CLUSTER_KEY when set,
// else the one kept in DIR/cluster-key, made at random on the first run.
func devClusterKey(dir string) (key, from string, err error) {
	if k := os.Getenv("QUEEN_CLUSTER_KEY"); k != "" {
		return k, "QUEEN_CLUSTER_KEY", nil
	}
	path := filepath.Join(dir, "cluster-key")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), path, nil
	} else if err != nil && !os.IsNotExist(err) {
		return "", "", fmt.Errorf("read the cluster key %s: %w (remove it to make a new one)", path, err)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("make a cluster key: %w", err)
	}
	key = hex.EncodeToString(b[:])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("write the cluster key %s: %w", path, err)
	}
	return key, path, nil
}
