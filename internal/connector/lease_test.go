package connector

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/testkit"
)

func testBroker(t *testing.T) *broker.Broker {
	t.Helper()
	b, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: t.TempDir(), RaftAddr: testkit.FreeAddr(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLease(t *testing.T) {
	b := testBroker(t)
	ctx := context.Background()
	key := LeaseKey("src")
	a := NewLease(b, "alpha", key, "node-a", 3*time.Second)
	other := NewLease(b, "alpha", key, "node-b", 3*time.Second)

	held, holder, err := a.Acquire(ctx)
	if err != nil || !held || holder != "node-a" {
		t.Fatalf("a acquires: %v %q %v", held, holder, err)
	}
	held, holder, err = other.Acquire(ctx)
	if err != nil || held || holder != "node-a" {
		t.Fatalf("b while a holds: %v %q %v", held, holder, err)
	}
	// The state a read shows names the holder and the expiry.
	st, err := NewStore(b).State(ctx, "alpha", "src")
	if err != nil || st.Lease == nil || st.Lease.Node != "node-a" || st.Lease.ExpiresAt <= time.Now().UnixMicro() {
		t.Fatalf("state: %+v %v", st.Lease, err)
	}
	// Another tenant's lease of the same name is another key.
	if held, _, err := NewLease(b, "beta", key, "node-b", 3*time.Second).Acquire(ctx); err != nil || !held {
		t.Fatalf("beta's lease: %v %v", held, err)
	}
	// Renewing moves the version; the fence follows it.
	v1 := a.Version()
	if err := a.Renew(ctx); err != nil || a.Version() == v1 {
		t.Fatalf("renew: %v (version %d -> %d)", err, v1, a.Version())
	}
	if _, err := b.Transaction(ctx, broker.TxnRequest{Tenant: "alpha", Internal: true, Ops: []broker.TxnOp{a.Check(),
		{Type: broker.OpKVPut, Key: PointerKey("src"), Value: []byte(`{"lsn":"0/1"}`)}}}); err != nil {
		t.Fatalf("a fenced write while holding: %v", err)
	}
	// Release hands it over at once.
	if err := a.Release(); err != nil || a.Held() {
		t.Fatalf("release: %v held=%v", err, a.Held())
	}
	if held, _, err := other.Acquire(ctx); err != nil || !held {
		t.Fatalf("b after the release: %v %v", held, err)
	}
	// The old holder's renew and fenced writes now fail.
	if err := a.Renew(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renew after losing: %v", err)
	}
	stale := broker.TxnOp{Type: broker.OpKVCheck, Key: key, IfVersion: &v1}
	if _, err := b.Transaction(ctx, broker.TxnRequest{Tenant: "alpha", Internal: true, Ops: []broker.TxnOp{stale,
		{Type: broker.OpKVPut, Key: PointerKey("src"), Value: []byte(`{"lsn":"0/2"}`)}}}); err == nil {
		t.Fatal("a write fenced by a lost lease committed")
	}
	// A holder that stops renewing loses the lease once its TTL passes.
	start := time.Now()
	if err := testkit.CheckFor(10*time.Second, 50*time.Millisecond, func() error {
		held, _, err := a.Acquire(ctx)
		if err != nil {
			return err
		}
		if !held {
			return errors.New("still held by b")
		}
		return nil
	}); err != nil {
		t.Fatalf("a takes over after b's TTL: %v", err)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("a took over after %v, before b's 3 s TTL could pass", d)
	}
	// A renew by b now reports the loss.
	if err := other.Renew(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("b renews a lease it lost: %v", err)
	}
	// A node that restarts takes back its own lease at once.
	again := NewLease(b, "alpha", key, "node-a", 3*time.Second)
	if held, _, err := again.Acquire(ctx); err != nil || !held {
		t.Fatalf("node-a again: %v %v", held, err)
	}
	// The runtime's safety net deletes only its own node's lease.
	if err := releaseIfHolder(ctx, b, "alpha", key, "node-b"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := b.KVGet(ctx, "alpha", key); !ok {
		t.Fatal("another node's release removed node-a's lease")
	}
	if err := releaseIfHolder(ctx, b, "alpha", key, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := b.KVGet(ctx, "alpha", key); ok {
		t.Fatal("node-a's lease is still there after its release")
	}
}

func TestParseSettings(t *testing.T) {
	def, err := ParseSettings(func(string) string { return "" })
	if err != nil || def != DefaultSettings() {
		t.Fatalf("defaults: %+v %v", def, err)
	}
	if def.Threads != 2 || def.Reload != 5*time.Second || def.LeaseTTL != 10*time.Second || def.ShutdownGrace != 10*time.Second || !def.Enabled || !def.AllowPrivateNetworks {
		t.Fatalf("defaults: %+v", def)
	}
	for _, c := range []struct {
		name, value string
		ok          bool
	}{
		{"QUEEN_PG_THREADS", "0", false}, {"QUEEN_PG_THREADS", "1", true}, {"QUEEN_PG_THREADS", "16", true}, {"QUEEN_PG_THREADS", "17", false},
		{"QUEEN_PG_THREADS", "two", false},
		{"QUEEN_PG_RELOAD_MS", "499", false}, {"QUEEN_PG_RELOAD_MS", "500", true}, {"QUEEN_PG_RELOAD_MS", "60000", true}, {"QUEEN_PG_RELOAD_MS", "60001", false},
		{"QUEEN_PG_LEASE_TTL_MS", "2999", false}, {"QUEEN_PG_LEASE_TTL_MS", "3000", true}, {"QUEEN_PG_LEASE_TTL_MS", "120000", true}, {"QUEEN_PG_LEASE_TTL_MS", "120001", false},
		{"QUEEN_PG_SHUTDOWN_GRACE_MS", "-1", false}, {"QUEEN_PG_SHUTDOWN_GRACE_MS", "0", true}, {"QUEEN_PG_SHUTDOWN_GRACE_MS", "120000", true}, {"QUEEN_PG_SHUTDOWN_GRACE_MS", "120001", false},
		{"QUEEN_PG_CONNECTORS", "false", true}, {"QUEEN_PG_CONNECTORS", "maybe", false},
		{"QUEEN_PG_ALLOW_PRIVATE_NETWORKS", "false", true}, {"QUEEN_PG_ALLOW_PRIVATE_NETWORKS", "2", false},
	} {
		s, err := ParseSettings(func(n string) string {
			if n == c.name {
				return c.value
			}
			return ""
		})
		if c.ok != (err == nil) {
			t.Errorf("%s=%s: ok=%v, got %v", c.name, c.value, c.ok, err)
			continue
		}
		if err != nil && !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s=%s: the error does not name the setting: %v", c.name, c.value, err)
		}
		if c.name == "QUEEN_PG_CONNECTORS" && c.ok && s.Enabled {
			t.Errorf("QUEEN_PG_CONNECTORS=false left connectors on")
		}
		if c.name == "QUEEN_PG_RELOAD_MS" && c.value == "500" && s.Reload != 500*time.Millisecond {
			t.Errorf("reload %v", s.Reload)
		}
	}
}
