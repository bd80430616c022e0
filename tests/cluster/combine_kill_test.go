package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCombineKill9: a single member under each durability setting is
// killed (SIGKILL from inside, QUEEN_FAILPOINTS) inside a combined round
// of its write path (internal/cluster/combine.go): with the round's
// entries written and applied but not synced, and with the loop released
// before the round's own fsync. After a restart without the failpoint
// every push acknowledged before the kill is served, and the push in
// flight at the kill, retried with its transaction id, is there once.
func TestCombineKill9(t *testing.T) {
	for _, mode := range []string{"always", "interval"} {
		for _, fp := range []string{"combine-written", "combine-syncing"} {
			if mode == "interval" && fp == "combine-syncing" {
				continue // no own sync round under interval
			}
			t.Run(mode+"/"+fp, func(t *testing.T) {
				c := startProcCluster(t, 1, "QUEEN_FSYNC="+mode)
				p := c.procs[0]
				env := append([]string(nil), p.env...)
				queue := "comb-" + mode
				for i := range 30 {
					pushOne(t, p, queue, fmt.Sprintf("a%d", i))
				}
				p.kill()
				p.env = append(append([]string(nil), env...), "QUEEN_FAILPOINTS="+fp+"=kill")
				p.start()
				// The first combined round after the start kills it: a
				// push in flight, whose reply never comes.
				if err := checkFor(30*time.Second, 20*time.Millisecond, func() error {
					if !p.alive() {
						return nil
					}
					doT("POST", p.base()+"/api/v1/push", map[string]any{"items": []pushItem{{Queue: queue, Partition: "p", TransactionID: "inflight", Payload: map[string]any{"id": "inflight"}}}}, 2*time.Second)
					return fmt.Errorf("alive")
				}); err != nil {
					t.Fatalf("%s never reached failpoint %s\n%s", p.id, fp, p.logTail())
				}
				if !strings.Contains(p.logTail(), "failpoint "+fp+": kill") {
					t.Fatalf("%s died, but not at failpoint %s:\n%s", p.id, fp, p.logTail())
				}
				p.env = env
				p.start()
				waitServing(t, c.nodes(), 60*time.Second)
				pushOne(t, p, queue, "inflight") // the retry
				got := drain(t, c.nodes(), queue, "verify", "all", 30*time.Second, func(seen []message) bool { return len(seen) >= 31 })
				count := map[string]int{}
				for _, m := range got {
					count[m.TransactionID]++
				}
				for i := range 30 {
					if id := fmt.Sprintf("a%d", i); count[id] != 1 {
						t.Errorf("acknowledged push %s delivered %d times", id, count[id])
					}
				}
				if count["inflight"] != 1 {
					t.Errorf("the push in flight at the kill, retried, delivered %d times", count["inflight"])
				}
				if len(got) != 31 {
					t.Errorf("delivered %d messages, want 31", len(got))
				}
			})
		}
	}
}
