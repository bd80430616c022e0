package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/pgtest"
)

type sourceRead struct {
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
	State struct {
		Lease *struct {
			Node string `json:"node"`
		} `json:"lease"`
	} `json:"state"`
}

func readSource(n node, name string) (sourceRead, error) {
	var r sourceRead
	code, b, err := doT("GET", n.base()+"/api/v1/connectors/"+name, nil, 5*time.Second)
	if err != nil || code != 200 {
		return r, fmt.Errorf("GET connector on %s: %d %v %s", n.name(), code, err, b)
	}
	return r, json.Unmarshal(b, &r)
}

// TestSourceTakeoverThreeNodes: three nodes run one source; the owner
// (state.lease.node) is killed with SIGKILL while a writer updates rows,
// another node streams within the lease TTL, and the queue holds every
// update exactly once, in order per row.
func TestSourceTakeoverThreeNodes(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	pg := pgtest.Private(t, pgtest.Options{})
	pg.Exec(t, "postgres", "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT g, 0 FROM generate_series(1, 200) g")
	const ttl = 3 * time.Second
	c := startProcCluster(t, 3, "QUEEN_ENCRYPTION_KEY="+strings.Repeat("6b", 32), "QUEEN_PG_RELOAD_MS=500", "QUEEN_PG_LEASE_TTL_MS=3000")
	nodes := c.nodes()
	leader := waitServing(t, nodes, 30*time.Second)
	doc := map[string]any{"kind": "source", "connection": map[string]any{"url": pg.URL("postgres")},
		"source": map[string]any{"tables": []map[string]any{{"table": "public.t", "queue": "t"}}}}
	if code, b, err := doT("PUT", leader.base()+"/api/v1/connectors/take", doc, 10*time.Second); err != nil || code != 200 {
		t.Fatalf("PUT: %d %v %s", code, err, b)
	}
	owner := func(except string) (node, error) {
		for _, n := range nodes {
			if !n.alive() || n.name() == except {
				continue
			}
			r, err := readSource(n, "take")
			if err != nil {
				return nil, err
			}
			if r.Status.Phase == "streaming" && r.State.Lease != nil && r.State.Lease.Node == n.name() {
				return n, nil
			}
		}
		return nil, fmt.Errorf("no node streams")
	}
	var first node
	if err := checkFor(60*time.Second, 100*time.Millisecond, func() (err error) { first, err = owner(""); return err }); err != nil {
		t.Fatal(err)
	}

	// The writer: 150 transactions, each adding 1 to a few random rows.
	final := map[int]int{}
	done := make(chan error, 1)
	wrng := rand.New(rand.NewSource(rng.Int63()))
	go func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, pg.URL("postgres"))
		if err != nil {
			done <- err
			return
		}
		defer conn.Close(ctx)
		for i := 0; i < 150; i++ {
			tx, err := conn.Begin(ctx)
			if err != nil {
				done <- err
				return
			}
			for j, n := 0, 1+wrng.Intn(5); j < n; j++ {
				k := 1 + wrng.Intn(200)
				if _, err := tx.Exec(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", k); err != nil {
					done <- err
					return
				}
				final[k]++
			}
			if err := tx.Commit(ctx); err != nil {
				done <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		done <- nil
	}()
	time.Sleep(time.Duration(500+rng.Intn(1000)) * time.Millisecond)
	c.byName(first).kill()
	killed := time.Now()
	var second node
	if err := checkFor(30*time.Second, 100*time.Millisecond, func() (err error) { second, err = owner(first.name()); return err }); err != nil {
		t.Fatal(err)
	}
	took := time.Since(killed)
	t.Logf("%s was killed; %s streams %v later (lease TTL %v)", first.name(), second.name(), took, ttl)
	if took > ttl+ttl/3+5*time.Second {
		t.Fatalf("the takeover took %v", took)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pg.Exec(t, "postgres", "INSERT INTO t VALUES (999999, 0)")
	var live []node
	for _, n := range nodes {
		if n.alive() {
			live = append(live, n)
		}
	}
	seen := drain(t, live, "t", "check", "all", 90*time.Second, func(seen []message) bool {
		for _, m := range seen {
			if m.Partition == "999999" {
				return true
			}
		}
		return false
	})
	// drain keeps the pop order, which is each partition's order.
	checkSourceHistory(t, seen, final)
}

// checkSourceHistory: ids are unique, each row has one snapshot row and as
// many update events as the writer made, in commit order.
func checkSourceHistory(t *testing.T, seen []message, final map[int]int) {
	t.Helper()
	ids := map[string]bool{}
	perKey := map[string]int{}
	snaps := map[string]int{}
	lastLSN := map[string]string{}
	for _, m := range seen {
		if ids[m.TransactionID] {
			t.Fatalf("message %s twice", m.TransactionID)
		}
		ids[m.TransactionID] = true
		if strings.Contains(m.TransactionID, ":s:") {
			snaps[m.Partition]++
			continue
		}
		perKey[m.Partition]++
		// pg:<epoch>:<16 hex digits of the commit LSN>:<seq>: fixed width,
		// so commit order is string order.
		if parts := strings.Split(m.TransactionID, ":"); len(parts) == 4 {
			if parts[2] < lastLSN[m.Partition] {
				t.Fatalf("row %s: commit %s after %s (out of order)", m.Partition, parts[2], lastLSN[m.Partition])
			}
			lastLSN[m.Partition] = parts[2]
		}
	}
	for k := 1; k <= 200; k++ {
		p := strconv.Itoa(k)
		if perKey[p] != final[k] {
			t.Fatalf("row %d: %d update events, the writer made %d", k, perKey[p], final[k])
		}
		if snaps[p] != 1 {
			t.Fatalf("row %d: %d snapshot rows", k, snaps[p])
		}
	}
}
