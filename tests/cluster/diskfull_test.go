package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/testkit"
)

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fill writes a file of n bytes (or until the disk refuses).
func fill(t *testing.T, path string, n int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := f.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

// metric reads one unlabelled series from /metrics/prometheus.
func metric(t *testing.T, n node, name string) (float64, bool) {
	t.Helper()
	code, b, err := doT("GET", n.base()+"/metrics/prometheus", nil, 5*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("metrics: %d %v", code, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var v float64
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}

// TestFullDisk: a node whose data directory's disk (a 64 MiB tmpfs) fills
// up answers writes at once with 507 insufficient_storage naming the data
// directory, keeps answering reads, shows the state in its metrics, and
// takes writes again by itself once space is freed, with every
// acknowledged message still there. Before, a push hung for a minute and
// the node stayed stuck until restarted.
func TestFullDisk(t *testing.T) {
	disk := testkit.Tmpfs(t, 64<<20)
	addrs := freeAddrs(t, 2)
	const reserve = 16 << 20
	p := &proc{t: t, id: "n1", httpAddr: addrs[0], raftAddr: addrs[1], dataDir: filepath.Join(disk, "data"),
		logPath: filepath.Join(t.TempDir(), "queen.log"),
		env:     []string{fmt.Sprintf("QUEEN_DISK_RESERVE_BYTES=%d", reserve), "QUEEN_RAFT_SEGMENT_BYTES=1048576"}}
	p.start()
	t.Cleanup(func() {
		if p.alive() {
			p.kill()
		}
		if t.Failed() {
			t.Logf("log of %s:\n%s", p.id, p.logTail())
		}
	})
	waitServing(t, []node{p}, 30*time.Second)

	acked := 0
	push := func(tag string) (int, []byte, time.Duration) {
		start := time.Now()
		code, b, err := doT("POST", p.base()+"/api/v1/push", map[string]any{"items": []pushItem{{Queue: "disk", Partition: "p", TransactionID: tag, Payload: map[string]any{"tag": tag}}}}, 70*time.Second)
		if err != nil {
			t.Fatalf("push %s: %v", tag, err)
		}
		if code == 201 {
			acked++
		}
		return code, b, time.Since(start)
	}
	for i := 0; i < 50; i++ {
		if code, b, _ := push(fmt.Sprintf("before-%d", i)); code != 201 {
			t.Fatalf("push before the disk filled: %d %s", code, b)
		}
	}
	filler := filepath.Join(disk, "filler")
	fill(t, filler, freeBytes(t, disk)-reserve/2)
	t.Logf("filled the disk: %d bytes free, reserve %d", freeBytes(t, disk), reserve)

	var body []byte
	var took time.Duration
	err := checkFor(5*time.Second, 50*time.Millisecond, func() error {
		code, b, d := push(fmt.Sprintf("full-%d", time.Now().UnixNano()))
		body, took = b, d
		if code != 507 {
			return fmt.Errorf("push answered %d %s, want 507", code, b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the full disk gave no 507: %v", err)
	}
	if took > time.Second {
		t.Errorf("the 507 took %v, want it at once", took)
	}
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("507 body %s: %v", body, err)
	}
	if !strings.Contains(string(body), `"insufficient_storage"`) || !strings.Contains(string(body), p.dataDir) {
		t.Errorf("507 body %s: want code insufficient_storage and the data directory %s", body, p.dataDir)
	}
	// Reads keep answering, at once.
	start := time.Now()
	code, b, err := doT("GET", p.base()+"/api/v1/resources/queues/disk", nil, 5*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("a read on the full disk: %d %s %v", code, b, err)
	}
	readTook := time.Since(start)
	if readTook > time.Second {
		t.Errorf("a read on the full disk took %v", readTook)
	}
	t.Logf("full disk: a push answered 507 in %v, a read 200 in %v", took.Round(time.Microsecond), readTook.Round(time.Microsecond))
	if v, ok := metric(t, p, "queen_read_only"); !ok || v != 1 {
		t.Errorf("queen_read_only = %v (present %v), want 1", v, ok)
	}
	if v, ok := metric(t, p, "queen_data_dir_free_bytes"); !ok || v >= reserve {
		t.Errorf("queen_data_dir_free_bytes = %v (present %v), want below %d", v, ok, reserve)
	}

	// Space freed: writes resume by themselves.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	err = checkFor(5*time.Second, 50*time.Millisecond, func() error {
		if code, b, _ := push(fmt.Sprintf("after-%d", time.Now().UnixNano())); code != 201 {
			return fmt.Errorf("push answered %d %s", code, b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("writes did not resume after space was freed: %v", err)
	}
	t.Logf("space freed: writes resumed within %v", time.Since(freed).Round(time.Millisecond))
	if v, _ := metric(t, p, "queen_read_only"); v != 0 {
		t.Errorf("queen_read_only = %v after space was freed, want 0", v)
	}
	got := drain(t, []node{p}, "disk", "check", "all", 20*time.Second, func(seen []message) bool { return len(seen) >= acked })
	if len(got) != acked {
		t.Fatalf("the queue holds %d messages, %d pushes were acknowledged", len(got), acked)
	}
}
