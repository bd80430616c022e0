package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// devPorts picks a -base-port whose six ports (HTTP and raft of three
// nodes) are free, below the kernel's ephemeral range.
func devPorts(t *testing.T) int {
	t.Helper()
	for try := 0; try < 200; try++ {
		base := 12000 + 30*rand.IntN(600)
		free := true
		for _, p := range []int{base, base + 1, base + 10, base + 11, base + 20, base + 21} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return base
		}
	}
	t.Fatal("no free -base-port range")
	return 0
}

// devCluster is one `queen dev-cluster` process.
type devCluster struct {
	t    *testing.T
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
	base int
}

func (d *devCluster) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.Write(p)
}

func (d *devCluster) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

func (d *devCluster) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func startDevCluster(t *testing.T, dir string, base int) *devCluster {
	t.Helper()
	d := &devCluster{t: t, done: make(chan struct{}), base: base}
	d.cmd = exec.Command(queenBin, "dev-cluster", "-data", dir, "-base-port", strconv.Itoa(base))
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUEEN_") {
			env = append(env, kv)
		}
	}
	d.cmd.Env = env
	d.cmd.Stdout, d.cmd.Stderr = d, d
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("dev-cluster output:\n%s", d.output())
		}
	})
	return d
}

// stop ends dev-cluster as Ctrl-C would and waits for it.
func (d *devCluster) stop() {
	if d.exited() {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		d.t.Errorf("dev-cluster did not stop within 30 s of SIGTERM")
	}
}

var pidLine = regexp.MustCompile(`(?m)^  (n\d)  pid (\d+)  http://(\S+)`)

// waitUp waits for the banner and returns each node's pid and HTTP address.
func (d *devCluster) waitUp() map[string][2]string {
	d.t.Helper()
	err := checkFor(60*time.Second, 50*time.Millisecond, func() error {
		if d.exited() {
			return fmt.Errorf("dev-cluster exited: %v", d.err)
		}
		if !strings.Contains(d.output(), "three nodes are up") {
			return fmt.Errorf("not up yet")
		}
		return nil
	})
	if err != nil {
		d.t.Fatalf("dev-cluster: %v", err)
	}
	nodes := map[string][2]string{}
	for _, m := range pidLine.FindAllStringSubmatch(d.output(), -1) {
		nodes[m[1]] = [2]string{m[2], m[3]}
	}
	if len(nodes) != 3 {
		d.t.Fatalf("banner names %d nodes with pids, want 3:\n%s", len(nodes), d.output())
	}
	return nodes
}

type clusterView struct {
	Leader  string `json:"leader"`
	Members []struct {
		ID      string `json:"id"`
		Address string `json:"address"`
	} `json:"members"`
}

func getCluster(addr string) (clusterView, error) {
	var v clusterView
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/api/v1/cluster")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return v, fmt.Errorf("GET /api/v1/cluster: %d %s", resp.StatusCode, b)
	}
	return v, json.Unmarshal(b, &v)
}

func devPush(addr string) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Post("http://"+addr+"/api/v1/push", "application/json", strings.NewReader(`{"items":[{"queue":"dev-q","payload":{"n":1}}]}`))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 && resp.StatusCode != 200 {
		return fmt.Errorf("push: %d %s", resp.StatusCode, b)
	}
	return nil
}

// Killing the leader of a dev cluster leaves the other two serving: they
// elect a leader and take writes, and dev-cluster keeps running.
func TestDevClusterSurvivesANodeKill(t *testing.T) {
	t.Parallel()
	d := startDevCluster(t, t.TempDir(), devPorts(t))
	nodes := d.waitUp()
	var leader string
	if err := checkFor(20*time.Second, 50*time.Millisecond, func() error {
		v, err := getCluster(nodes["n1"][1])
		if err != nil || v.Leader == "" {
			return fmt.Errorf("no leader yet (%v)", err)
		}
		leader = v.Leader
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(nodes[leader][0])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s (pid %d): %v", leader, pid, err)
	}
	t.Logf("killed the leader %s (pid %d)", leader, pid)
	for id, n := range nodes {
		if id == leader {
			continue
		}
		if err := checkFor(30*time.Second, 100*time.Millisecond, func() error {
			v, err := getCluster(n[1])
			if err != nil {
				return err
			}
			if v.Leader == "" || v.Leader == leader {
				return fmt.Errorf("%s sees leader %q", id, v.Leader)
			}
			return devPush(n[1])
		}); err != nil {
			t.Fatalf("after killing %s, %s: %v", leader, id, err)
		}
	}
	if d.exited() {
		t.Fatalf("dev-cluster exited after one node died: %v", d.err)
	}
	if !strings.Contains(d.output(), "node "+leader+" exited") {
		t.Errorf("dev-cluster did not report %s's exit", leader)
	}
}

// A first start that fails leaves no half-bootstrapped nodes behind: a
// rerun on other ports forms one cluster at the new ports. Data made on
// other ports is refused with the fix named.
func TestDevClusterFailedStartLeavesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// n3's store cannot open (its state directory is a file): n1 and n2
	// start and bootstrap, n3 exits.
	if err := os.MkdirAll(filepath.Join(dir, "n3"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "n3", "state"), []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDevCluster(t, dir, devPorts(t))
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		t.Fatal("dev-cluster still running though n3 cannot start")
	}
	if d.err == nil || !strings.Contains(d.output(), "node n3 exited during start-up") || !strings.Contains(d.output(), "removed what this start created") {
		t.Fatalf("dev-cluster: %v; want a failure naming n3 and saying what it removed", d.err)
	}
	for _, n := range []string{"n1", "n2"} {
		if _, err := os.Stat(filepath.Join(dir, n)); !os.IsNotExist(err) {
			t.Errorf("%s left behind after the failed start (%v)", n, err)
		}
	}
	os.RemoveAll(filepath.Join(dir, "n3"))

	base := devPorts(t)
	d2 := startDevCluster(t, dir, base)
	nodes := d2.waitUp()
	if err := checkFor(20*time.Second, 50*time.Millisecond, func() error {
		v, err := getCluster(nodes["n2"][1])
		if err != nil {
			return err
		}
		if v.Leader == "" || len(v.Members) != 3 {
			return fmt.Errorf("cluster %+v", v)
		}
		for _, m := range v.Members {
			want := map[string]int{"n1": base + 1, "n2": base + 11, "n3": base + 21}[m.ID]
			if m.Address != fmt.Sprintf("127.0.0.1:%d", want) {
				return fmt.Errorf("member %s at %s; want port %d (the rerun's)", m.ID, m.Address, want)
			}
		}
		return devPush(nodes["n1"][1])
	}); err != nil {
		t.Fatalf("rerun on -base-port %d: %v", base, err)
	}
	d2.stop()
	if d2.err != nil {
		t.Errorf("dev-cluster after Ctrl-C: %v; want exit 0", d2.err)
	}

	// The same data on other ports: refused before any node starts.
	other := devPorts(t)
	out, errOut, code := runQueen(t, nil, "dev-cluster", "-data", dir, "-base-port", strconv.Itoa(other))
	if code != 1 || !strings.Contains(errOut, fmt.Sprintf("run with -base-port %d to resume it, or remove %s", base, dir)) {
		t.Errorf("rerun on other ports: exit %d\n%s%s\nwant exit 1 naming -base-port %d and the removal", code, out, errOut, base)
	}
}
