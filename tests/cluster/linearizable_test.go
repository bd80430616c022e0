package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A register per key, written only by compare-and-set. Every write puts a
// value never written before, so "ifVersion = the version read together
// with value v" holds exactly when the current value is v: the model keeps
// values and needs no versions.
type casInput struct {
	key      string
	read     bool
	from, to string // cas: expected value ("" = absent) and new value
}

type casOutput struct {
	value   string // read: the value ("" = absent)
	ok      bool   // cas: applied
	unknown bool   // cas: no answer (it may or may not have been applied)
}

// partitionBy splits a history into independent parts by a key of each
// operation's input, in order of first appearance.
func partitionBy(history []porcupine.Operation, key func(in any) string) [][]porcupine.Operation {
	by := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range history {
		k := key(op.Input)
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], op)
	}
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, by[k])
	}
	return out
}

var casModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		return partitionBy(history, func(in any) string { return in.(casInput).key })
	},
	Init: func() any { return "" },
	Step: func(st, in, out any) (bool, any) {
		s, i, o := st.(string), in.(casInput), out.(casOutput)
		switch {
		case i.read:
			return o.value == s, s
		case o.unknown:
			if s == i.from {
				return true, i.to
			}
			return true, s
		case o.ok:
			return s == i.from, i.to
		default:
			return s != i.from, s
		}
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(casInput), out.(casOutput)
		if i.read {
			return fmt.Sprintf("get(%s) -> %q", i.key, o.value)
		}
		res := "fail"
		if o.unknown {
			res = "unknown"
		} else if o.ok {
			res = "ok"
		}
		return fmt.Sprintf("cas(%s, %q -> %q) -> %s", i.key, i.from, i.to, res)
	},
}

type kvGetReply struct {
	Value   json.RawMessage `json:"value"`
	Version uint64          `json:"version"`
}

// never is the Return of an operation that got no answer: it may take
// effect at any time after its call.
const never = 1 << 62

// linRecorder collects the histories of one test: KV compare-and-set and
// per-partition FIFO operations, with counts of each kind of outcome.
type linRecorder struct {
	t     *testing.T
	start time.Time
	mu    sync.Mutex
	kv    []porcupine.Operation
	fifo  []porcupine.Operation
	count map[string]int
}

func newLinRecorder(t *testing.T) *linRecorder {
	return &linRecorder{t: t, start: time.Now(), count: map[string]int{}}
}

func (r *linRecorder) now() int64 { return int64(time.Since(r.start)) }

func (r *linRecorder) add(fifo bool, kind string, op porcupine.Operation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fifo {
		r.fifo = append(r.fifo, op)
	} else {
		r.kv = append(r.kv, op)
	}
	r.count[kind]++
}

func (r *linRecorder) counts() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.count))
	for k := range r.count {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, r.count[k])
	}
	return strings.TrimSpace(b.String())
}

// notSent reports an error that proves the request never reached a server:
// the connection was refused. (Pushes and KV writes are not GETs, so the
// client never resends one that was written on an earlier connection; pops
// go through getNoRetry.)
func notSent(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// runKVClient reads a random key and, half of the time, writes it with
// compare-and-set on the version it read, on random live nodes.
func runKVClient(r *linRecorder, nodes []node, cl int, prefix string, stop <-chan struct{}) {
	rng := rand.New(rand.NewSource(int64(cl) + time.Now().UnixNano()))
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		key := fmt.Sprintf("%s-%d", prefix, rng.Intn(3))
		n := pickLive(rng, nodes)
		call := r.now()
		code, b, err := doT("GET", n.base()+"/api/v1/kv/"+key, nil, 2*time.Second)
		ret := r.now()
		var cur string
		var version uint64
		switch {
		case err == nil && code == 200:
			var g kvGetReply
			if err := json.Unmarshal(b, &g); err != nil {
				r.t.Errorf("kv get reply %s", b)
				return
			}
			cur, version = string(g.Value), g.Version
		case err == nil && code == 404:
		default:
			// No answer: a read changes nothing, so it is left out.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		r.add(false, "kv-read", porcupine.Operation{ClientId: cl, Input: casInput{key: key, read: true}, Output: casOutput{value: cur}, Call: call, Return: ret})
		if rng.Intn(2) == 0 {
			continue
		}
		to := fmt.Sprintf(`"c%d-%d"`, cl, seq)
		n = pickLive(rng, nodes)
		call = r.now()
		code, _, err = doT("PUT", n.base()+"/api/v1/kv/"+key, map[string]any{"value": json.RawMessage(to), "ifVersion": version}, 2*time.Second)
		ret = r.now()
		var o casOutput
		kind := "kv-cas-refused"
		switch {
		case err == nil && code == 200:
			o.ok, kind = true, "kv-cas-ok"
		case err == nil && code == 409:
		case notSent(err):
			continue
		default:
			o.unknown, kind = true, "kv-cas-unknown"
			ret = never
		}
		r.add(false, kind, porcupine.Operation{ClientId: cl, Input: casInput{key: key, from: cur, to: to}, Output: o, Call: call, Return: ret})
	}
}

// fifoPushOnce pushes ids to one partition on a random live node and
// records the operation. It reports whether the push was answered.
func fifoPushOnce(r *linRecorder, rng *rand.Rand, nodes []node, cl int, queue, part string, ids []string) bool {
	items := make([]pushItem, len(ids))
	for i, id := range ids {
		items[i] = pushItem{Queue: queue, Partition: part, TransactionID: id, Payload: map[string]any{"id": id}}
	}
	n := pickLive(rng, nodes)
	call := r.now()
	code, b, err := doT("POST", n.base()+"/api/v1/push", map[string]any{"items": items}, 2*time.Second)
	ret := r.now()
	out := fifoOutput{}
	kind := "push-ok"
	switch {
	case err == nil && code == 201:
		var rep pushReply
		if err := json.Unmarshal(b, &rep); err != nil || len(rep) != len(ids) {
			r.t.Errorf("push reply %s: %v", b, err)
			return true
		}
		out.dup = make([]bool, len(ids))
		for i, it := range rep {
			if it.TransactionID != ids[i] {
				r.t.Errorf("push reply item %d is %s, want %s", i, it.TransactionID, ids[i])
			}
			out.dup[i] = it.Status == "duplicate"
		}
	case notSent(err):
		return false
	case err == nil && code < 500 && code != 429:
		r.t.Errorf("push refused: %d %s", code, b)
		return true
	default:
		out.unknown, kind = true, "push-unknown"
		ret = never
	}
	r.add(true, kind, porcupine.Operation{ClientId: cl, Input: fifoInput{part: part, push: ids}, Output: out, Call: call, Return: ret})
	return !out.unknown
}

// popc sends each pop on a new connection. Go's http.Transport sends a
// GET again, on a new connection, when a reused connection fails before the
// answer arrives; a pop is a GET that changes state, so such a retry could
// apply it twice, or fail to dial a killed node and look as if the pop had
// never been sent while the first attempt had in fact been applied.
var popc = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// getNoRetry sends a GET that the client never repeats by itself.
func getNoRetry(url string, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := popc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// fifoPopOnce pops up to batch messages of one partition (queue mode,
// autoAck) on a random live node and records the operation. It reports
// whether the pop was answered and whether the partition was empty.
func fifoPopOnce(r *linRecorder, rng *rand.Rand, nodes []node, cl int, queue, part string, batch int) (answered, empty bool) {
	n := pickLive(rng, nodes)
	url := fmt.Sprintf("%s/api/v1/pop/queue/%s/partition/%s?autoAck=true&batch=%d", n.base(), queue, part, batch)
	call := r.now()
	code, b, err := getNoRetry(url, 2*time.Second)
	ret := r.now()
	out := fifoOutput{}
	kind := "pop-ok"
	switch {
	case err == nil && code == 200:
		var rep popReply
		if err := json.Unmarshal(b, &rep); err != nil {
			r.t.Errorf("pop reply %s: %v", b, err)
			return true, false
		}
		for _, m := range rep.Messages {
			if m.Partition != part {
				r.t.Errorf("a pop of partition %s returned a message of partition %s", part, m.Partition)
			}
			out.got = append(out.got, m.TransactionID)
		}
		if len(out.got) == 0 {
			r.t.Errorf("pop answered 200 without messages: %s", b)
		}
	case err == nil && code == 204:
		kind = "pop-empty"
	case notSent(err):
		return false, false
	case err == nil && code < 500:
		r.t.Errorf("pop refused: %d %s", code, b)
		return true, false
	default:
		out.unknown, kind = true, "pop-unknown"
		ret = never
	}
	r.add(true, kind, porcupine.Operation{ClientId: cl, Input: fifoInput{part: part, batch: batch}, Output: out, Call: call, Return: ret})
	return !out.unknown, kind == "pop-empty"
}

// runFIFOClient pushes 1-2 messages at a time to, or pops 1-3 messages
// from, a random partition of queue. A push without an answer is retried
// with the same transaction ids (up to three attempts in all). Pops take
// out more than pushes put in, so the partitions are often empty: the order
// of concurrent pushes is then settled by the next pops, which keeps the
// search of the checker short.
func runFIFOClient(r *linRecorder, nodes []node, cl int, queue string, parts int, stop <-chan struct{}) {
	rng := rand.New(rand.NewSource(int64(cl) + time.Now().UnixNano()))
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		part := fmt.Sprintf("p%d", rng.Intn(parts))
		if rng.Intn(100) < 45 {
			var ids []string
			for k := 0; k < 1+rng.Intn(2); k++ {
				ids = append(ids, fmt.Sprintf("c%d-%d-%d", cl, seq, k))
			}
			for attempt := 0; attempt < 3; attempt++ {
				if fifoPushOnce(r, rng, nodes, cl, queue, part, ids) {
					break
				}
				time.Sleep(time.Duration(10+rng.Intn(40)) * time.Millisecond)
			}
			continue
		}
		if answered, _ := fifoPopOnce(r, rng, nodes, cl, queue, part, 1+rng.Intn(3)); !answered {
			time.Sleep(time.Duration(10+rng.Intn(40)) * time.Millisecond)
		}
	}
}

// drainFIFO pops every partition until it answers empty, so that a message
// that was pushed and then lost shows in the history.
func drainFIFO(r *linRecorder, nodes []node, cl int, queue string, parts int) {
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	for p := 0; p < parts; p++ {
		part := fmt.Sprintf("p%d", p)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if answered, empty := fifoPopOnce(r, rng, nodes, cl, queue, part, 10); answered && empty {
				break
			}
		}
	}
}

// checkHistory runs porcupine over ops and fails the test, with a
// visualization written to a file, unless they are linearizable.
func checkHistory(t *testing.T, name string, model porcupine.Model, ops []porcupine.Operation) {
	t.Helper()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, time.Minute)
	t.Logf("%s: porcupine checked %d operations in %v: %s", name, len(ops), time.Since(start).Round(time.Millisecond), res)
	if res != porcupine.Ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("queen-%s-%d.html", name, time.Now().UnixNano()))
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			t.Logf("visualization: %s", path)
		} else {
			t.Logf("visualization failed: %v", err)
		}
		if res == porcupine.Unknown {
			t.Fatalf("%s: porcupine could not decide within its time limit (history of %d operations too large)", name, len(ops))
		}
		t.Fatalf("%s history is not linearizable", name)
	}
}

// linWorkload runs KV and FIFO clients on nodes until stop is closed.
func linWorkload(r *linRecorder, nodes []node, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for cl := 0; cl < 4; cl++ {
		wg.Add(2)
		go func() { defer wg.Done(); runKVClient(r, nodes, cl, "lin", stop) }()
		go func() { defer wg.Done(); runFIFOClient(r, nodes, cl, "fifo", 3, stop) }()
	}
	return &wg
}

// checkLinWorkload drains the FIFO partitions, asserts that the histories
// are not trivial, and checks them with porcupine.
func checkLinWorkload(t *testing.T, r *linRecorder, nodes []node) {
	t.Helper()
	drainFIFO(r, nodes, 4, "fifo", 3)
	t.Logf("history: %s", r.counts())
	r.mu.Lock()
	kv, fifo := r.kv, r.fifo
	for _, k := range []string{"kv-read", "kv-cas-ok", "kv-cas-refused", "push-ok", "pop-ok", "pop-empty"} {
		if r.count[k] == 0 {
			t.Errorf("history too thin to check: no %s", k)
		}
	}
	r.mu.Unlock()
	if t.Failed() {
		t.FailNow()
	}
	checkHistory(t, "kv", casModel, kv)
	checkHistory(t, "fifo", fifoModelFor(fifo), fifo)
}

// TestLinearizableAcrossLeaderKills records histories of KV
// compare-and-set and reads, and of pushes and pops of three queue
// partitions, from clients on every node while the leader is killed with
// SIGKILL (QUEEN_TRIALS kills; 3 by default, 1 under -short), and checks
// them with porcupine: KV against a register per key, each partition
// against a FIFO queue.
func TestLinearizableAcrossLeaderKills(t *testing.T) {
	kills := trials(3, 1)
	c := startProcCluster(t, 3)
	nodes := c.nodes()
	r := newLinRecorder(t)
	stop := make(chan struct{})
	wg := linWorkload(r, nodes, stop)
	for k := 0; k < kills; k++ {
		time.Sleep(time.Duration(800+rand.Intn(800)) * time.Millisecond)
		leader := waitServing(t, nodes, 20*time.Second)
		victim := c.byName(leader)
		victim.kill()
		waitServing(t, others(nodes, leader), 20*time.Second)
		time.Sleep(time.Duration(300+rand.Intn(500)) * time.Millisecond)
		victim.start()
		waitServing(t, nodes, 30*time.Second)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("%d leader kills", kills)
	checkLinWorkload(t, r, nodes)
}

// TestLinearizableUnderPartitions records the same histories in an
// in-process cluster whose leader is cut off from both followers by the
// fault-injecting proxies (QUEEN_TRIALS rounds; 2 by default, 1 under
// -short) and healed again, and checks them with porcupine.
func TestLinearizableUnderPartitions(t *testing.T) {
	rounds := trials(2, 1)
	fn := newFaultNet(t)
	in := startInprocCluster(t, 3, fn, nil)
	nodes := asNodes(in)
	r := newLinRecorder(t)
	stop := make(chan struct{})
	wg := linWorkload(r, nodes, stop)
	for round := 0; round < rounds; round++ {
		time.Sleep(time.Duration(700+rand.Intn(600)) * time.Millisecond)
		leader := waitServing(t, nodes, 20*time.Second)
		li := 0
		for i, n := range nodes {
			if n == leader {
				li = i
			}
		}
		fn.isolate(li, len(nodes))
		waitServing(t, others(nodes, leader), 20*time.Second)
		// Longer than the clients' 2 s timeout, so that some requests to
		// the isolated node get no answer and others are answered after
		// the heal.
		time.Sleep(time.Duration(2000+rand.Intn(1000)) * time.Millisecond)
		fn.heal()
		waitServing(t, nodes, 20*time.Second)
		t.Logf("round %d: isolated leader %s, healed", round, leader.name())
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	checkLinWorkload(t, r, nodes)
}
