package cluster

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
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

var casModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(casInput).key
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

// TestLinearizableKVAcrossLeaderKills records compare-and-set and read
// histories from clients on every node while the leader is killed with
// SIGKILL (QUEEN_TRIALS kills; 3 by default, 1 under -short) and checks
// them with porcupine.
func TestLinearizableKVAcrossLeaderKills(t *testing.T) {
	kills := trials(3, 1)
	c := startProcCluster(t, 3)
	nodes := c.nodes()
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }

	var mu sync.Mutex
	var ops []porcupine.Operation
	var reads, casOK, casFail, casUnknown int
	record := func(op porcupine.Operation) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const clients = 5
	for cl := 0; cl < clients; cl++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(cl) + time.Now().UnixNano()))
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("lin-%d", rng.Intn(3))
				n := pickLive(rng, nodes)
				call := now()
				code, b, err := doT("GET", n.base()+"/api/v1/kv/"+key, nil, 2*time.Second)
				ret := now()
				var cur string
				var version uint64
				switch {
				case err == nil && code == 200:
					var r kvGetReply
					if err := json.Unmarshal(b, &r); err != nil {
						t.Errorf("kv get reply %s", b)
						return
					}
					cur, version = string(r.Value), r.Version
				case err == nil && code == 404:
				default:
					// No answer: a read changes nothing, so it is left out.
					time.Sleep(10 * time.Millisecond)
					continue
				}
				record(porcupine.Operation{ClientId: cl, Input: casInput{key: key, read: true}, Output: casOutput{value: cur}, Call: call, Return: ret})
				mu.Lock()
				reads++
				mu.Unlock()
				if rng.Intn(2) == 0 {
					continue
				}
				to := fmt.Sprintf(`"c%d-%d"`, cl, seq)
				n = pickLive(rng, nodes)
				call = now()
				code, b, err = doT("PUT", n.base()+"/api/v1/kv/"+key, map[string]any{"value": json.RawMessage(to), "ifVersion": version}, 2*time.Second)
				ret = now()
				var o casOutput
				switch {
				case err == nil && code == 200:
					o.ok = true
				case err == nil && code == 409:
				default:
					o.unknown = true
					ret = 1 << 62 // may take effect at any time after the call
				}
				mu.Lock()
				switch {
				case o.unknown:
					casUnknown++
				case o.ok:
					casOK++
				default:
					casFail++
				}
				mu.Unlock()
				record(porcupine.Operation{ClientId: cl, Input: casInput{key: key, from: cur, to: to}, Output: o, Call: call, Return: ret})
			}
		}()
	}
	for k := 0; k < kills; k++ {
		time.Sleep(time.Duration(800+rand.Intn(800)) * time.Millisecond)
		leader := waitServing(t, nodes, 20*time.Second)
		victim := c.byName(leader)
		victim.kill()
		var live []node
		for _, x := range nodes {
			if x != leader {
				live = append(live, x)
			}
		}
		waitServing(t, live, 20*time.Second)
		time.Sleep(time.Duration(300+rand.Intn(500)) * time.Millisecond)
		victim.start()
		waitServing(t, nodes, 30*time.Second)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("history: %d reads, %d cas ok, %d cas refused, %d cas unknown, %d leader kills", reads, casOK, casFail, casUnknown, kills)
	if casOK == 0 || reads == 0 || casFail == 0 {
		t.Fatalf("history too thin to check: %d reads, %d cas ok, %d refused", reads, casOK, casFail)
	}
	res, info := porcupine.CheckOperationsVerbose(casModel, ops, 2*time.Minute)
	if res != porcupine.Ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("queen-linearizability-%d.html", time.Now().UnixNano()))
		if err := porcupine.VisualizePath(casModel, info, path); err == nil {
			t.Logf("visualization: %s", path)
		}
		t.Fatalf("KV history is not linearizable: %s", res)
	}
}
