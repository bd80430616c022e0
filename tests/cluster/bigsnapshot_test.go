package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/cluster"
)

// bigMessages is how many messages TestSnapshotCatchUpMillions loads:
// QUEEN_BIG_MESSAGES when set, else 1,000,000 (200,000 under -short).
func bigMessages() int {
	if v, err := strconv.Atoi(os.Getenv("QUEEN_BIG_MESSAGES")); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return 200_000
	}
	return 1_000_000
}

const (
	bigQueue      = "big"
	bigPartitions = 16
	bigBatch      = 1000
	// Snapshot settings of the big cluster: a snapshot every 256 entries
	// (checked every second), 64 entries kept behind it, 1 MiB log
	// segments, so that the log is truncated soon after a snapshot.
	bigSnapThreshold = 256
	bigTrailing      = 64
)

var bigEnv = []string{
	"QUEEN_LOG_LEVEL=info",
	"QUEEN_SNAPSHOT_THRESHOLD=" + strconv.Itoa(bigSnapThreshold),
	"QUEEN_SNAPSHOT_INTERVAL=1s",
	"QUEEN_SNAPSHOT_TRAILING_LOGS=" + strconv.Itoa(bigTrailing),
	"QUEEN_RAFT_SEGMENT_BYTES=1048576",
}

// bigPushBody is a push of n messages to one partition of queue big.
func bigPushBody(part int, tag string, k, n int) []byte {
	b := make([]byte, 0, 16+n*80)
	b = append(b, `{"items":[`...)
	for j := 0; j < n; j++ {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"queue":"big","partition":"p`...)
		b = strconv.AppendInt(b, int64(part), 10)
		b = append(b, `","payload":{"tag":"`...)
		b = append(b, tag...)
		b = append(b, `","k":`...)
		b = strconv.AppendInt(b, int64(k), 10)
		b = append(b, `,"j":`...)
		b = strconv.AppendInt(b, int64(j), 10)
		b = append(b, "}}"...)
	}
	return append(b, "]}"...)
}

// pushBig pushes count messages over HTTP to the given nodes, round robin,
// in requests of per messages (one partition each) from workers goroutines.
func pushBig(t *testing.T, nodes []node, tag string, count, per, workers int) {
	t.Helper()
	requests := (count + per - 1) / per
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= requests {
					return
				}
				n := nodes[k%len(nodes)]
				body := bigPushBody(k%bigPartitions, tag, k, min(per, count-k*per))
				code, b, err := doT("POST", n.base()+"/api/v1/push", json.RawMessage(body), 60*time.Second)
				if err != nil || code != 201 {
					errs <- fmt.Errorf("push %d of %d (%s) to %s: %d %.200s %v", k, requests, tag, n.name(), code, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

var slowc = &http.Client{Timeout: 2 * time.Minute}

// selfStatus is n's own view of itself.
func selfStatus(n node, checksum bool) (*cluster.NodeStatus, error) {
	v, err := getCluster(n, checksum)
	if err != nil {
		return nil, err
	}
	for _, m := range v.Members {
		if m.Status != nil && m.Status.ID == n.name() {
			return m.Status, nil
		}
	}
	return nil, fmt.Errorf("%s does not report its own status (members %+v)", n.name(), v.Members)
}

// leaderStatus is the status of the node that leads, asked of itself.
func leaderStatus(nodes []node) (node, *cluster.NodeStatus, error) {
	for _, n := range nodes {
		if !n.alive() {
			continue
		}
		st, err := selfStatus(n, false)
		if err == nil && st.State == "Leader" {
			return n, st, nil
		}
	}
	return nil, nil, fmt.Errorf("no node leads")
}

// waitCaughtUp waits until n has applied as far as the leader had when the
// wait began, and fails unless it got there by installing a snapshot.
func waitCaughtUp(t *testing.T, nodes []node, n node, within time.Duration) {
	t.Helper()
	var want uint64
	var st *cluster.NodeStatus
	err := checkFor(within, 50*time.Millisecond, func() error {
		if want == 0 {
			_, ls, err := leaderStatus(nodes)
			if err != nil {
				return err
			}
			want = ls.AppliedIndex
		}
		var err error
		if st, err = selfStatus(n, false); err != nil {
			return err
		}
		if st.AppliedIndex < want {
			return fmt.Errorf("%s at applied index %d (leader at %d), %d snapshots installed", n.name(), st.AppliedIndex, want, st.SnapshotRestores)
		}
		// A joining node counts once the leader has made it a voter.
		v, err := getCluster(n, false)
		if err != nil {
			return err
		}
		for _, m := range v.Members {
			if m.ID == n.name() && m.Suffrage != "Voter" {
				return fmt.Errorf("%s caught up but is a %s", n.name(), m.Suffrage)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.SnapshotRestores < 1 {
		t.Fatalf("%s caught up from the log, without installing a snapshot", n.name())
	}
}

// sameChecksums waits until every live node has applied the same index and
// compares their state checksums. A checksum is a full scan, so each node
// is asked for the checksums once (it asks the others too; any node's
// answer for a member counts), not in a polling loop.
func sameChecksums(t *testing.T, nodes []node) string {
	t.Helper()
	var idx uint64
	err := checkFor(60*time.Second, 50*time.Millisecond, func() error {
		idx = 0
		for _, n := range nodes {
			st, err := selfStatus(n, false)
			if err != nil {
				return err
			}
			if idx != 0 && st.AppliedIndex != idx {
				return fmt.Errorf("applied indexes differ: %s at %d, another at %d", n.name(), st.AppliedIndex, idx)
			}
			idx = st.AppliedIndex
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for _, n := range nodes {
		if sums[n.name()] != "" {
			continue
		}
		// Not httpc: its 5 s limit is less than three full scans can take
		// on a busy machine.
		resp, err := slowc.Get(n.base() + "/api/v1/cluster?checksum=true")
		if err != nil {
			t.Fatalf("checksums from %s: %v", n.name(), err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if code := resp.StatusCode; err != nil || code != 200 {
			t.Fatalf("checksums from %s: %d %s %v", n.name(), code, b, err)
		}
		var v clusterView
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		for _, m := range v.Members {
			if m.Status == nil || m.Status.Checksum == "" {
				continue
			}
			if m.Status.AppliedIndex != idx {
				t.Fatalf("%s moved from applied index %d to %d while the cluster was idle", m.ID, idx, m.Status.AppliedIndex)
			}
			sums[m.ID] = m.Status.Checksum
		}
	}
	var first string
	for _, n := range nodes {
		s := sums[n.name()]
		if first == "" {
			first = s
		}
		if s == "" || s != first {
			t.Fatalf("state checksums at applied index %d differ: %v", idx, sums)
		}
	}
	return first
}

// snapshotLog returns the snapshot lines of a node's log.
func snapshotLog(p *proc) []string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "installed a snapshot") || strings.Contains(l, "took a snapshot") {
			if i := strings.Index(l, "msg="); i >= 0 {
				l = l[i:]
			}
			out = append(out, l)
		}
	}
	return out
}

type queueDetail struct {
	Partitions int64 `json:"partitions"`
	Messages   struct {
		Total int64 `json:"total"`
	} `json:"messages"`
}

// TestSnapshotCatchUpMillions: a one-node cluster (a real process) is
// loaded with a million messages (bigMessages) over HTTP and grown to three
// nodes; each new node, with an empty data directory, catches up from a
// snapshot of that store. Then one node is killed while the log moves on
// past it and is truncated, and restarted: it catches up from a snapshot
// again. All three end with the same state checksum. Finally the first
// node (the only one whose state never came from a snapshot) is killed, so
// a restored node leads, and a new consumer group pops the first messages of
// every partition through the restarted node, each in offset order from
// 0, while the queue's totals read there are exact. The test
// logs how long loading, snapshotting and each catch-up take.
func TestSnapshotCatchUpMillions(t *testing.T) {
	total := bigMessages()
	addrs := freeAddrs(t, 6)
	var procs []*proc
	for i := 0; i < 3; i++ {
		dir := t.TempDir()
		p := &proc{t: t, id: fmt.Sprintf("n%d", i+1), httpAddr: addrs[2*i], raftAddr: addrs[2*i+1],
			dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "queen.log"), env: append([]string(nil), bigEnv...)}
		procs = append(procs, p)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			if p.alive() {
				p.kill()
			}
		}
		for _, p := range procs {
			for _, l := range snapshotLog(p) {
				t.Logf("%s: %s", p.id, l)
			}
			if t.Failed() {
				t.Logf("log of %s:\n%s", p.id, p.logTail())
			}
		}
	})
	n1, n2, n3 := procs[0], procs[1], procs[2]
	all := []node{n1, n2, n3}
	n1.env = append(n1.env, "QUEEN_PEERS=n1="+n1.raftAddr)
	n1.start()
	waitServing(t, []node{n1}, 30*time.Second)

	start := time.Now()
	pushBig(t, []node{n1}, "a", total, bigBatch, 4)
	took := time.Since(start)
	st, err := selfStatus(n1, false)
	if err != nil {
		t.Fatal(err)
	}
	loaded := st.AppliedIndex
	t.Logf("pushed %d messages (requests of %d) to n1 in %v: %.0f messages/s; log index %d",
		total, bigBatch, took.Round(time.Millisecond), float64(total)/took.Seconds(), loaded)

	// Small pushes until a snapshot covers every loaded message.
	start = time.Now()
	tail := 0
	err = checkFor(60*time.Second, 0, func() error {
		st, err := selfStatus(n1, false)
		if err != nil {
			return err
		}
		if st.SnapshotIndex >= loaded {
			return nil
		}
		pushBig(t, []node{n1}, "tail", 10, 10, 1)
		tail += 10
		return fmt.Errorf("n1's newest snapshot is at index %d, want %d", st.SnapshotIndex, loaded)
	})
	if err != nil {
		t.Fatal(err)
	}
	total += tail
	t.Logf("n1 took a snapshot covering all %d messages %v after the load (%d more messages pushed meanwhile); state %s",
		total, time.Since(start).Round(time.Millisecond), tail, mib(dirSize(filepath.Join(n1.dataDir, "state"))))

	// Two nodes with empty data directories join, one after the other;
	// each catches up from the snapshot.
	for _, p := range []*proc{n2, n3} {
		p.env = append(p.env, "QUEEN_JOIN="+n1.httpAddr)
		start = time.Now()
		p.start()
		waitCaughtUp(t, all, p, 3*time.Minute)
		t.Logf("%s joined with an empty data directory and caught up from the snapshot in %v", p.id, time.Since(start).Round(time.Millisecond))
	}
	waitServing(t, all, 30*time.Second)

	// n3 is killed; the log moves on past it and is truncated behind a
	// new snapshot; n3 restarts and catches up from it.
	n3.kill()
	down, err := selfStatus(n1, false)
	if err != nil {
		t.Fatal(err)
	}
	const extraPer = 100
	extra := 0
	start = time.Now()
	err = checkFor(60*time.Second, 0, func() error {
		_, ls, err := leaderStatus(all)
		if err != nil {
			return err
		}
		// Past the trailing entries and well past a 1 MiB segment of them.
		if ls.SnapshotIndex > down.AppliedIndex+bigTrailing+200 {
			return nil
		}
		pushBig(t, []node{n1, n2}, "b", 20*extraPer, extraPer, 1)
		extra += 20 * extraPer
		return fmt.Errorf("newest snapshot at %d, n3 stopped at %d", ls.SnapshotIndex, down.AppliedIndex)
	})
	if err != nil {
		t.Fatal(err)
	}
	total += extra
	t.Logf("n3 down at index %d; %d more messages pushed and a snapshot taken past it in %v", down.AppliedIndex, extra, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	n3.start()
	waitCaughtUp(t, all, n3, 3*time.Minute)
	t.Logf("n3 restarted and caught up from a snapshot in %v", time.Since(start).Round(time.Millisecond))
	waitServing(t, all, 30*time.Second)

	start = time.Now()
	sum := sameChecksums(t, all)
	t.Logf("the three nodes have the same state checksum %s (compared in %v)", sum, time.Since(start).Round(time.Millisecond))

	// Only restored nodes remain; one of them leads.
	n1.kill()
	waitServing(t, []node{n2, n3}, 30*time.Second)
	for _, n := range []node{n2, n3} {
		code, b, err := doT("GET", n.base()+"/api/v1/resources/queues/"+bigQueue, nil, 30*time.Second)
		if err != nil || code != 200 {
			t.Fatalf("queue detail on %s: %d %.300s %v", n.name(), code, b, err)
		}
		var qd queueDetail
		if err := json.Unmarshal(b, &qd); err != nil {
			t.Fatalf("queue detail %.300s: %v", b, err)
		}
		if qd.Messages.Total != int64(total) || qd.Partitions != bigPartitions {
			t.Errorf("%s reports %d messages in %d partitions, want %d in %d", n.name(), qd.Messages.Total, qd.Partitions, total, bigPartitions)
		}
	}
	// A new group reads the first messages of every partition, through n3.
	popped := 0
	start = time.Now()
	for p := 0; p < bigPartitions; p++ {
		part := fmt.Sprintf("p%d", p)
		url := fmt.Sprintf("%s/api/v1/pop/queue/%s/partition/%s?consumerGroup=verify&subscriptionMode=all&autoAck=true&batch=2000", n3.base(), bigQueue, part)
		code, b, err := doT("GET", url, nil, 30*time.Second)
		if err != nil || code != 200 {
			t.Fatalf("pop of %s on n3: %d %.300s %v", part, code, b, err)
		}
		var r popReply
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("pop reply: %v", err)
		}
		if len(r.Messages) != 2000 {
			t.Errorf("pop of %s on n3: %d messages, want 2000", part, len(r.Messages))
		}
		for i, m := range r.Messages {
			if m.Partition != part || m.Offset != uint64(i) {
				t.Fatalf("pop of %s on n3: message %d is offset %d of partition %s", part, i, m.Offset, m.Partition)
			}
		}
		popped += len(r.Messages)
	}
	t.Logf("a new group popped %d messages, the first 2000 of each of the %d partitions in offset order, through n3 in %v", popped, bigPartitions, time.Since(start).Round(time.Millisecond))
}

// dirSize is the total size of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
		return nil
	})
	return n
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
