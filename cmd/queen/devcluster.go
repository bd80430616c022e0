package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// devClusterMarker, in the -data directory, records the -base-port the
// dev cluster there was created with.
const devClusterMarker = "dev-cluster-base-port"

// devNode is one child `queen serve` of the dev cluster.
type devNode struct {
	id, http, raft, dir string
	cmd                 *exec.Cmd
	done                chan struct{}
}

// devCluster runs three nodes of this binary on 127.0.0.1 (HTTP base,
// base+10, base+20; raft one above each; data in DIR/n1..n3), prefixes
// their logs, and stops them all on Ctrl-C. One node's exit leaves the
// other two serving, so failover can be tried. Started again on the same
// data it resumes the same cluster; a first start that fails removes what
// it created, so a rerun (on other ports too) starts afresh.
func devCluster(args []string) error {
	fs := flag.NewFlagSet("dev-cluster", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: queen dev-cluster [-data DIR] [-base-port N]

Three local nodes of one cluster: n1 serves HTTP on N, n2 on N+10, n3 on N+20,
each with raft one port above (defaults 6632/6642/6652 and 6633/6643/6653).
Kill one (its pid is printed) and the other two elect a leader and keep
serving; Ctrl-C stops all; run again on the same -data to resume.

`)
		fs.PrintDefaults()
	}
	dataDir := fs.String("data", "./data", "directory holding the nodes' data directories n1, n2, n3")
	basePort := fs.Int("base-port", 6632, "HTTP port of n1; node i uses base+10*(i-1) for HTTP and one more for raft")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("dev-cluster: unexpected argument %q (see queen dev-cluster -h)", fs.Arg(0))
	}
	if *basePort < 1 || *basePort+21 > 65535 {
		return fmt.Errorf("dev-cluster: -base-port %d: want 1 to 65514", *basePort)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	var nodes []*devNode
	var peers []string
	for i := 1; i <= 3; i++ {
		p := *basePort + 10*(i-1)
		n := &devNode{id: fmt.Sprintf("n%d", i), http: fmt.Sprintf("127.0.0.1:%d", p), raft: fmt.Sprintf("127.0.0.1:%d", p+1),
			dir: filepath.Join(*dataDir, fmt.Sprintf("n%d", i)), done: make(chan struct{})}
		nodes = append(nodes, n)
		peers = append(peers, n.id+"="+n.raft)
	}
	fresh, err := checkDevData(*dataDir, *basePort, nodes)
	if err != nil {
		return err
	}
	// Every port is checked before any node starts: a node that cannot
	// listen would leave the others bootstrapped without it.
	for _, n := range nodes {
		for _, addr := range []string{n.http, n.raft} {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("dev-cluster: %s (for %s) is not free: %w; stop what uses it, or pick other ports with -base-port", addr, n.id, err)
			}
			ln.Close()
		}
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
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
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
	// failStart stops the nodes and removes the data directories this
	// start created: a half-bootstrapped cluster would tie a rerun to
	// these ports. Data that was there before is kept.
	failStart := func(err error) error {
		stopAll()
		var removed, kept []string
		for i, n := range nodes {
			if !fresh[i] {
				kept = append(kept, n.dir)
				continue
			}
			if rerr := os.RemoveAll(n.dir); rerr != nil {
				return fmt.Errorf("%w; removing the partly created %s failed too: %v (remove it by hand before a rerun)", err, n.dir, rerr)
			}
			removed = append(removed, n.dir)
		}
		if len(removed) > 0 {
			err = fmt.Errorf("%w; removed what this start created (%s), so a rerun starts those afresh", err, strings.Join(removed, ", "))
		}
		if len(kept) > 0 {
			err = fmt.Errorf("%w; kept %s (there before this start)", err, strings.Join(kept, ", "))
		}
		return err
	}
	for _, n := range nodes {
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return failStart(err)
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
			return failStart(fmt.Errorf("start %s: %w", n.id, err))
		}
		n.cmd = cmd
		var pipes sync.WaitGroup
		pipes.Add(2)
		go func() { defer pipes.Done(); prefix(n.id, stdout) }()
		go func() { defer pipes.Done(); prefix(n.id, stderr) }()
		go func() { pipes.Wait(); cmd.Wait(); close(n.done) }()
	}
	// Wait until every node answers healthy (or one exits).
	hc := &http.Client{Timeout: time.Second}
	healthy := func(addr string) bool {
		resp, err := hc.Get("http://" + addr + "/health")
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
				return failStart(fmt.Errorf("node %s exited during start-up (see its log above)", n.id))
			default:
			}
			all = all && healthy(n.http)
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			return failStart(errors.New("the nodes did not become healthy within a minute"))
		}
		select {
		case <-sigs:
			stopAll()
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := os.WriteFile(filepath.Join(*dataDir, devClusterMarker), []byte(strconv.Itoa(*basePort)+"\n"), 0o644); err != nil {
		stopAll()
		return fmt.Errorf("record the ports in %s: %w", *dataDir, err)
	}
	outMu.Lock()
	fmt.Fprintf(os.Stderr, "\nqueen dev-cluster: three nodes are up (any node takes any request; followers forward to the leader)\n")
	for _, n := range nodes {
		fmt.Fprintf(os.Stderr, "  %s  pid %d  http://%s  raft %s  data %s\n", n.id, n.cmd.Process.Pid, n.http, n.raft, n.dir)
	}
	fmt.Fprintf(os.Stderr, "  the nodes prove the cluster key of %s to each other on their raft ports\n", keyFrom)
	fmt.Fprintf(os.Stderr, `try:
  curl -s -XPOST http://%s/api/v1/push -d '{"items":[{"queue":"q","payload":{"hello":"world"}}]}'
  curl -s 'http://%s/api/v1/pop/queue/q?autoAck=true'
  curl -s http://%s/api/v1/cluster
failover: kill -9 one node's pid; the other two elect a leader and keep serving.
Ctrl-C stops all three (the data stays; run again with the same -data and -base-port to resume,
which also restarts a killed node).

`, nodes[0].http, nodes[1].http, nodes[2].http)
	outMu.Unlock()
	exited := make(chan *devNode, len(nodes))
	for _, n := range nodes {
		go func() { <-n.done; exited <- n }()
	}
	running := len(nodes)
	for {
		select {
		case sig := <-sigs:
			fmt.Fprintf(os.Stderr, "queen dev-cluster: %s: stopping the nodes\n", sig)
			stopAll()
			return nil
		case n := <-exited:
			running--
			if running == 0 {
				return errors.New("every node has exited")
			}
			outMu.Lock()
			fmt.Fprintf(os.Stderr, "queen dev-cluster: node %s exited (%v); the other %d keep running (two of three keep a majority). "+
				"Ctrl-C and run dev-cluster again to bring it back.\n", n.id, n.cmd.ProcessState, running)
			outMu.Unlock()
		}
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

// checkDevData reports which nodes' data directories hold nothing yet, and
// refuses data that a dev cluster on other ports created.
func checkDevData(dataDir string, basePort int, nodes []*devNode) (fresh []bool, err error) {
	b, err := os.ReadFile(filepath.Join(dataDir, devClusterMarker))
	switch {
	case err == nil:
		was, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if perr == nil && was != basePort {
			return nil, fmt.Errorf("dev-cluster: %s holds a cluster created with -base-port %d, whose nodes know each other at those ports: run with -base-port %d to resume it, or remove %s (make clean) to start a new one on %d",
				dataDir, was, was, dataDir, basePort)
		}
	case !os.IsNotExist(err):
		return nil, fmt.Errorf("dev-cluster: read %s: %w", filepath.Join(dataDir, devClusterMarker), err)
	}
	for _, n := range nodes {
		entries, err := os.ReadDir(n.dir)
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("dev-cluster: read %s: %w", n.dir, err)
		}
		fresh = append(fresh, len(entries) == 0)
	}
	return fresh, nil
}
