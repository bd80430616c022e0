package pgsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// openBroker starts a one-node broker in dir (a fresh one when "").
func openBroker(t *testing.T, dir string) *broker.Broker {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	b, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: dir, RaftAddr: testkit.FreeAddr(t)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		b.Close()
		t.Fatal(err)
	}
	return b
}

// sourceDoc is a source document with every default filled in, as the
// connector runtime stores it.
func sourceDoc(s *pgtest.Server, db, name string, tables ...connector.TableSpec) connector.Document {
	manage := true
	return connector.Document{
		Name: name, Kind: connector.KindSource, Version: 1,
		Connection: connector.Connection{URL: s.URL(db)},
		Source: &connector.SourceSpec{
			Tables: tables, Slot: "queen_" + underscore(name), Publication: "queen_" + underscore(name), ManagePublication: &manage,
			Snapshot: "initial", SnapshotChunkRows: 2000, MaxBundleMessages: 1000, MaxBundleBytes: 4 << 20,
			LingerMs: 20, HeartbeatSeconds: 10, OnTruncate: "skip",
		},
	}
}

func underscore(s string) string {
	out := []byte(s)
	for i, c := range out {
		if c == '-' {
			out[i] = '_'
		}
	}
	return string(out)
}

// running is a source started by startSource.
type running struct {
	src    *Source
	status *connector.StatusReporter
	cancel context.CancelFunc
	done   chan error
}

// startSource runs the source of doc on b until the test ends (or stop).
func startSource(t *testing.T, b *broker.Broker, doc connector.Document, node string, h *hooks) *running {
	t.Helper()
	return startSourceEnv(t, connector.Env{Broker: b, Tenant: "default", Doc: doc, NodeID: node, AllowPrivateNetworks: true}, h)
}

// startSourceEnv runs the source of env (a status reporter and metrics
// are added).
func startSourceEnv(t *testing.T, env connector.Env, h *hooks) *running {
	t.Helper()
	st := connector.NewStatusReporter(connector.PhaseConnecting)
	env.Status = st
	if env.Metrics == nil {
		env.Metrics = nopMetrics()
	}
	rn, err := New(env)
	if err != nil {
		t.Fatal(err)
	}
	src := rn.(*Source)
	src.hooks = h
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{src: src, status: st, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- src.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the source and waits for it.
func (r *running) stop(t *testing.T) error {
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the source did not stop within 30 s")
		return nil
	}
}

// waitPhase polls the status until phase (or an error phase, which fails
// the test unless phase is "error").
func (r *running) waitPhase(t *testing.T, phase string) connector.Status {
	t.Helper()
	var st connector.Status
	err := testkit.CheckFor(60*time.Second, 20*time.Millisecond, func() error {
		st = r.status.Get()
		if st.Phase == phase {
			return nil
		}
		if st.Phase == connector.PhaseError {
			return fmt.Errorf("phase error %s: %s", st.Code, st.Message)
		}
		return fmt.Errorf("phase %s", st.Phase)
	})
	if err != nil {
		t.Fatalf("waiting for phase %s: %v", phase, err)
	}
	return st
}

// event is a decoded change event.
type event struct {
	Op        string                     `json:"op"`
	Table     string                     `json:"table"`
	Key       map[string]json.RawMessage `json:"key"`
	After     map[string]json.RawMessage `json:"after"`
	Before    map[string]json.RawMessage `json:"before"`
	Unchanged []string                   `json:"unchanged"`
	LSN       string                     `json:"lsn"`
	Xid       *uint32                    `json:"xid"`
	TS        string                     `json:"ts"`
	Seq       int                        `json:"seq"`
}

type got struct {
	msg broker.Message
	ev  event
	raw map[string]json.RawMessage
}

// drain pops queue with group until want messages arrived (exactly: a
// further pop must find nothing more), in per-partition order.
func drain(t *testing.T, b *broker.Broker, queue, group string, want int) []got {
	t.Helper()
	ctx := context.Background()
	var out []got
	deadline := time.Now().Add(60 * time.Second)
	for len(out) < want {
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: %d messages after 60 s, want %d", queue, len(out), want)
		}
		res, err := b.Pop(ctx, broker.PopRequest{Tenant: "default", Queue: queue, Group: group, Batch: 10000, Partitions: 10000,
			AutoAck: true, SubscriptionMode: "all", Wait: true, Timeout: 500 * time.Millisecond})
		if err != nil {
			var be *broker.Error
			if errors.As(err, &be) && be.Code == "queue_not_found" {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			t.Fatal(err)
		}
		for _, m := range res.Messages {
			g, err := decodeGot(m)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, g)
		}
	}
	res, err := b.Pop(ctx, broker.PopRequest{Tenant: "default", Queue: queue, Group: group, Batch: 10000, Partitions: 10000,
		AutoAck: true, SubscriptionMode: "all", Wait: true, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Messages) > 0 {
		t.Fatalf("queue %s: %d messages beyond the %d expected, first %s", queue, len(res.Messages), want, res.Messages[0].Data)
	}
	return sortGot(out)
}

func decodeGot(m broker.Message) (got, error) {
	g := got{msg: m}
	if err := json.Unmarshal(m.Data, &g.ev); err != nil {
		return g, fmt.Errorf("message %s: %w", m.Data, err)
	}
	if err := json.Unmarshal(m.Data, &g.raw); err != nil {
		return g, err
	}
	return g, nil
}

// sortGot orders messages by partition, then offset.
func sortGot(out []got) []got {
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].msg.Partition != out[j].msg.Partition {
			return out[i].msg.Partition < out[j].msg.Partition
		}
		return out[i].msg.Offset < out[j].msg.Offset
	})
	return out
}

// recMetrics records the connector metrics a source sets.
type recMetrics struct {
	mu sync.Mutex
	v  map[string]float64
}

type recSeries struct {
	m    *recMetrics
	name string
}

func (s recSeries) Add(v float64) { s.m.mu.Lock(); s.m.v[s.name] += v; s.m.mu.Unlock() }
func (s recSeries) Set(v float64) { s.m.mu.Lock(); s.m.v[s.name] = v; s.m.mu.Unlock() }

func (m *recMetrics) get(name string) float64 { m.mu.Lock(); defer m.mu.Unlock(); return m.v[name] }

func (m *recMetrics) String() string { m.mu.Lock(); defer m.mu.Unlock(); return fmt.Sprint(m.v) }

func newRecMetrics() (*recMetrics, *connector.ConnectorMetrics) {
	m := &recMetrics{v: map[string]float64{}}
	s := func(n string) recSeries { return recSeries{m: m, name: n} }
	return m, &connector.ConnectorMetrics{
		SourceTransactions: s("transactions"), SourceMessages: s("messages"), SourceBundles: s("bundles"),
		SourceSnapshotRows: s("snapshot_rows"), SourceSlotLagBytes: s("slot_lag"), SourcePointerLSN: s("pointer_lsn"),
		SinkApplied: s("x"), SinkSkipped: s("x"), SinkDLQ: s("x"), SinkBatches: s("x"), Errors: s("errors"), Owner: s("owner"),
	}
}
