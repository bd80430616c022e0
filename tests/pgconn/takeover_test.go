package pgconn

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// leaseTTL is QUEEN_PG_LEASE_TTL_MS of every node here.
const leaseTTL = 3 * time.Second

// TestTakeoverAfterKill9: three queen processes run one source; the owner
// (state.lease.node) is killed with kill -9 while a writer changes the
// table. Another node streams the source within the lease TTL (plus the
// time to notice), and the queue holds every change once, in commit
// order per key: no gap, no duplicate.
func TestTakeoverAfterKill9(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	const rows = 1000
	pg := pgtest.Shared(t)
	db := pg.NewDatabase(t)
	url := pg.URL(db)
	pg.Exec(t, db, fmt.Sprintf(`CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT g, 0 FROM generate_series(1, %d) g`, rows))
	nodes := startNodes(t, 3)
	mustCall(t, "PUT", nodes[1].base()+"/api/v1/connectors/takeover", sourceDoc(pg, db, []M{{"table": "public.t", "queue": "t"}}, M{"lingerMs": 5}), 200)

	owner := waitOwner(t, nodes, nil)
	waitPhase(t, owner, "takeover", "streaming", 60*time.Second)
	for _, p := range nodes {
		if p != owner {
			waitPhase(t, p, "takeover", "standby", 30*time.Second)
		}
	}
	w := startLoad(url, rows, rand.New(rand.NewSource(rng.Int63())))
	time.Sleep(time.Duration(300+rng.Intn(1000)) * time.Millisecond)
	owner.kill()
	killed := time.Now()
	t.Logf("kill -9 of the owner %s", owner.id)
	next := waitOwner(t, nodes, owner)
	waitPhase(t, next, "takeover", "streaming", 30*time.Second)
	took := time.Since(killed)
	t.Logf("%s streams the source %v after the kill (lease TTL %v)", next.id, took.Round(time.Millisecond), leaseTTL)
	// The lease lapses at most a TTL after the owner's last renewal; the
	// standby notices within its next attempt, and a leader's death adds
	// an election.
	if took > leaseTTL+2*time.Second {
		t.Fatalf("the takeover took %v; the lease TTL is %v", took, leaseTTL)
	}
	time.Sleep(time.Duration(500+rng.Intn(1000)) * time.Millisecond)
	w.finish(t)
	pg.Exec(t, db, `INSERT INTO t VALUES (999999999, 0)`)
	var live []*proc
	for _, p := range nodes {
		if p.alive() {
			live = append(live, p)
		}
	}
	checkHistory(t, drainUntil(t, live, "t", "check", "999999999", 2*time.Minute), w, "999999999")
}

// waitOwner waits until a live node other than not reads state.lease.node
// naming a live node other than not, and returns that node.
func waitOwner(t testing.TB, nodes []*proc, not *proc) *proc {
	t.Helper()
	var owner *proc
	err := testkit.CheckFor(30*time.Second, 20*time.Millisecond, func() error {
		for _, p := range nodes {
			if p == not || !p.alive() {
				continue
			}
			v, ok := connector(p, "takeover")
			if !ok || v.State == nil || v.State.Lease == nil {
				continue
			}
			for _, q := range nodes {
				if q.id == v.State.Lease.Node && q != not && q.alive() {
					owner = q
					return nil
				}
			}
			return fmt.Errorf("lease held by %q", v.State.Lease.Node)
		}
		return fmt.Errorf("no node reads a lease")
	})
	if err != nil {
		t.Fatal(err)
	}
	return owner
}
