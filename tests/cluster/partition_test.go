package cluster

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
)

const (
	partHeartbeat = 300 * time.Millisecond
	partElection  = 300 * time.Millisecond
)

// startInprocCluster starts size in-process nodes over real TCP. With a
// faultNet, node i dials from 127.0.0.(11+i) and advertises a proxy.
func startInprocCluster(t *testing.T, size int, fn *faultNet, tune func(*cluster.Config)) []*inproc {
	t.Helper()
	addrs := freeAddrs(t, 2*size)
	var nodes []*inproc
	var peers []cluster.Peer
	for i := 0; i < size; i++ {
		id := fmt.Sprintf("n%d", i+1)
		cc := cluster.Config{DataDir: filepath.Join(t.TempDir(), id), NodeID: id, RaftAddr: addrs[2*i+1],
			HeartbeatTimeout: partHeartbeat, ElectionTimeout: partElection}
		if fn != nil {
			cc.SourceIP = fmt.Sprintf("127.0.0.%d", 11+i)
			cc.Advertise = fn.addNode(t, i, cc.SourceIP, cc.RaftAddr)
		}
		if tune != nil {
			tune(&cc)
		}
		peers = append(peers, cluster.Peer{ID: id, Address: cc.Advertise})
		if cc.Advertise == "" {
			peers[i].Address = cc.RaftAddr
		}
		nodes = append(nodes, &inproc{id: id, httpAddr: addrs[2*i], cfg: broker.Config{Cluster: cc, Logger: testLogger(t)}})
	}
	for _, n := range nodes {
		n.cfg.Cluster.Peers = peers
		n.cfg.Cluster.Logger = n.cfg.Logger
		n.open(t)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.close()
		}
	})
	waitServing(t, asNodes(nodes), 20*time.Second)
	return nodes
}

func asNodes(ns []*inproc) []node {
	out := make([]node, len(ns))
	for i, n := range ns {
		out[i] = n
	}
	return out
}

type writeResult struct {
	txid       string
	node       int
	sent, done time.Time
	ok         bool
}

// TestPartitionIsolatingTheLeader cuts the leader off from both followers
// with the proxies (QUEEN_TRIALS rounds; 2 by default, 1 under -short).
// The isolated node must stop answering writes and reads with success and
// say it cannot serve within the election timeout (plus slack); the
// majority must elect a leader and take writes; after healing, every write
// any node answered with success is stored exactly once and all nodes
// converge to the same state.
func TestPartitionIsolatingTheLeader(t *testing.T) {
	rounds := trials(2, 1)
	fn := newFaultNet(t)
	nodes := startInprocCluster(t, 3, fn, nil)
	all := asNodes(nodes)
	for round := 0; round < rounds; round++ {
		partitionRound(t, fn, nodes, all, round)
	}
	waitConverged(t, all, 30*time.Second)
}

func partitionRound(t *testing.T, fn *faultNet, nodes []*inproc, all []node, round int) {
	queue := fmt.Sprintf("part%d", round)
	var mu sync.Mutex
	var writes []writeResult
	var readsOK []struct {
		node       int
		sent, done time.Time
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := w % len(nodes)
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("%s-w%d-%d", queue, w, seq)
				item := pushItem{Queue: queue, Partition: fmt.Sprintf("w%d", w), TransactionID: id, Payload: map[string]any{"id": id}}
				sent := time.Now()
				code, _, err := doT("POST", nodes[target].base()+"/api/v1/push", map[string]any{"items": []pushItem{item}}, time.Second)
				mu.Lock()
				writes = append(writes, writeResult{txid: id, node: target, sent: sent, done: time.Now(), ok: err == nil && code == 201})
				mu.Unlock()
				if err != nil || code != 201 {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	for r := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(30 * time.Millisecond):
				}
				sent := time.Now()
				code, _, err := doT("GET", nodes[r].base()+"/api/v1/resources/queues/"+queue, nil, time.Second)
				if err == nil && code < 500 {
					mu.Lock()
					readsOK = append(readsOK, struct {
						node       int
						sent, done time.Time
					}{r, sent, time.Now()})
					mu.Unlock()
				}
			}
		}()
	}

	time.Sleep(700 * time.Millisecond)
	var li int
	leader := waitServing(t, all, 20*time.Second)
	for i, n := range nodes {
		if n == leader {
			li = i
		}
	}
	// The cut is complete when isolate returns: from then on nothing the
	// isolated node sends reaches the others. Timed before it, a loaded
	// machine that delays isolate (its thread descheduled while it holes
	// the links) lets writes sent meanwhile commit normally.
	begun := time.Now()
	fn.isolate(li, len(nodes))
	cut := time.Now()
	if d := cut.Sub(begun); d > 10*time.Millisecond {
		t.Logf("round %d: cutting the links took %v", round, d.Round(time.Millisecond))
	}

	// The isolated node stops serving.
	var stepDown time.Duration
	if err := checkFor(10*time.Second, 5*time.Millisecond, func() error {
		if code, h := getHealth(leader); code == 200 {
			return fmt.Errorf("isolated %s still healthy: %+v", leader.name(), h)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stepDown = time.Since(cut)
	// It refuses linearizable reads (checked below), but answers a read
	// that opts in to its own, possibly stale, state.
	if code, b, err := doT("GET", leader.base()+"/api/v1/resources/queues/"+queue+"?consistency=stale", nil, 2*time.Second); err != nil || code != 200 {
		t.Errorf("a stale read on the isolated node: %d %s %v, want 200 from its own state", code, b, err)
	}
	if code, _, err := doT("GET", leader.base()+"/api/v1/resources/queues/"+queue+"?consistency=sometimes", nil, 2*time.Second); err != nil || code != 400 {
		t.Errorf("consistency=sometimes: %d %v, want 400", code, err)
	}
	// The majority elects a leader.
	waitServing(t, others(all, leader), 20*time.Second)
	elected := time.Since(cut)
	time.Sleep(2500 * time.Millisecond)
	healed := time.Now()
	fn.heal()
	waitServing(t, all, 20*time.Second)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	bound := partElection + 500*time.Millisecond // the election timeout plus scheduling slack
	t.Logf("round %d: isolated leader %s; it stopped serving after %v, the majority elected a leader after %v", round, leader.name(), stepDown.Round(time.Millisecond), elected.Round(time.Millisecond))
	if stepDown > bound {
		t.Errorf("the isolated leader said it could serve for %v after the cut (bound %v)", stepDown, bound)
	}
	majorityOK, minorityRefused := 0, 0
	for _, w := range writes {
		during := w.done.After(cut) && w.done.Before(healed)
		if w.node == li && w.ok && w.sent.After(cut) && during {
			t.Errorf("write %s sent to the isolated node at +%v was answered 201 at +%v, before the partition healed",
				w.txid, w.sent.Sub(cut), w.done.Sub(cut))
		}
		if w.node == li && w.sent.After(cut.Add(bound)) && w.sent.Before(healed) && !(w.ok && w.done.Before(healed)) {
			minorityRefused++
		}
		if w.node != li && w.ok && w.sent.After(cut.Add(elected)) && during {
			majorityOK++
		}
	}
	for _, r := range readsOK {
		if r.node == li && r.sent.After(cut.Add(bound)) && r.done.Before(healed) {
			t.Errorf("a read on the isolated node sent at +%v was answered at +%v, before the partition healed", r.sent.Sub(cut), r.done.Sub(cut))
		}
	}
	if majorityOK == 0 {
		t.Errorf("the majority answered no write with 201 during the partition")
	}
	if minorityRefused == 0 {
		t.Errorf("no write was sent to the isolated node during the partition (the check above saw nothing)")
	}
	// Every write answered 201, by any node, is there exactly once.
	okIDs := map[string]bool{}
	for _, w := range writes {
		if w.ok {
			okIDs[w.txid] = true
		}
	}
	got := drain(t, all, queue, "verify", "all", 30*time.Second, func(seen []message) bool {
		have := map[string]bool{}
		for _, m := range seen {
			have[m.TransactionID] = true
		}
		for id := range okIDs {
			if !have[id] {
				return false
			}
		}
		return true
	})
	count := map[string]int{}
	for _, m := range got {
		count[m.TransactionID]++
	}
	for id := range okIDs {
		if count[id] != 1 {
			t.Errorf("write %s was answered 201 but is stored %d times", id, count[id])
		}
	}
	for id, c := range count {
		if c > 1 {
			t.Errorf("%s stored %d times", id, c)
		}
	}
	t.Logf("round %d: %d writes answered 201 (%d by the majority during the partition), %d refused by the isolated node, %d stored", round, len(okIDs), majorityOK, minorityRefused, len(got))
}
