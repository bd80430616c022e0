package pgsink

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// newDB makes a fresh database on the shared server and returns its URL.
func newDB(t testing.TB) string {
	t.Helper()
	pg := pgtest.Shared(t)
	return pg.URL(pg.NewDatabase(t))
}

// asRole is dbURL with another role and password.
func asRole(dbURL, role, password string) string {
	u, _ := url.Parse(dbURL)
	u.User = url.UserPassword(role, password)
	return u.String()
}

func exec(t testing.TB, dbURL string, sqls ...string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range sqls {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// query returns the rows of q, each as its columns' text joined by " | ".
func query(t testing.TB, dbURL, q string) []string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var parts []string
		for _, v := range rows.RawValues() {
			if v == nil {
				parts = append(parts, "NULL")
			} else {
				parts = append(parts, string(v))
			}
		}
		out = append(out, strings.Join(parts, " | "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func count(t testing.TB, dbURL, q string) int {
	t.Helper()
	r := query(t, dbURL, q)
	var n int
	fmt.Sscan(r[0], &n)
	return n
}

func openBroker(t testing.TB) *broker.Broker {
	t.Helper()
	return openBrokerWith(t, cluster.Config{})
}

// openBrokerWith opens a broker with cfg's settings (its data directory
// and raft address filled in) and waits for it to lead.
func openBrokerWith(t testing.TB, cfg cluster.Config) *broker.Broker {
	t.Helper()
	cfg.DataDir, cfg.RaftAddr = t.TempDir(), testkit.FreeAddr(t)
	b, err := broker.Open(broker.Config{Cluster: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := testkit.CheckFor(10*time.Second, 5*time.Millisecond, func() error {
		if !b.Node().IsLeader() {
			return fmt.Errorf("no leader")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return b
}

// counter is a test Counter.
type counter struct {
	mu sync.Mutex
	v  float64
}

func (c *counter) Add(d float64) { c.mu.Lock(); c.v += d; c.mu.Unlock() }
func (c *counter) Set(d float64) { c.mu.Lock(); c.v = d; c.mu.Unlock() }
func (c *counter) get() float64  { c.mu.Lock(); defer c.mu.Unlock(); return c.v }

type testMetrics struct {
	applied, skipped, dlq, batches, errors counter
}

func (m *testMetrics) handles() *connector.ConnectorMetrics {
	g := &counter{}
	return &connector.ConnectorMetrics{
		SourceTransactions: g, SourceMessages: g, SourceBundles: g, SourceSnapshotRows: g,
		SourceSlotLagBytes: g, SourcePointerLSN: g, Owner: g,
		SinkApplied: &m.applied, SinkSkipped: &m.skipped, SinkDLQ: &m.dlq, SinkBatches: &m.batches, Errors: &m.errors,
	}
}

// sinkSpec is a sink document's block with the framework's defaults.
func sinkSpec(queue, table, mode string) *connector.SinkSpec {
	return &connector.SinkSpec{Queue: queue, Table: table, Mode: mode, SubscriptionMode: "all",
		Batch: 500, Workers: 1, LeaseSeconds: 60, MaxAttempts: 3, ProgressTable: "queen.sink_progress"}
}

// running is a sink running in the test.
type running struct {
	sink    *sink
	status  *connector.StatusReporter
	metrics *testMetrics
	cancel  context.CancelFunc
	done    chan error
	once    sync.Once
}

// connFor is a connection block for dbURL.
func connFor(dbURL string) connector.Connection {
	return connector.Connection{URL: dbURL, SSLMode: "disable", ConnectTimeoutMs: 10000}
}

func envFor(b *broker.Broker, name string, conn connector.Connection, spec *connector.SinkSpec) (connector.Env, *testMetrics) {
	if spec.ConsumerGroup == "" {
		spec.ConsumerGroup = "pg-" + name
	}
	m := &testMetrics{}
	return connector.Env{
		Broker: b, Tenant: "default",
		Doc:    connector.Document{Name: name, Kind: connector.KindSink, Connection: conn, Sink: spec},
		NodeID: "n1", AllowPrivateNetworks: true,
		Status: connector.NewStatusReporter(connector.PhaseConnecting), Metrics: m.handles(),
		CPU: connector.NewPool(2),
	}, m
}

// startSink runs a sink until the test ends.
func startSink(t testing.TB, b *broker.Broker, name, dbURL string, spec *connector.SinkSpec) *running {
	t.Helper()
	env, m := envFor(b, name, connFor(dbURL), spec)
	r, err := New(env)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs := &running{sink: r.(*sink), status: env.Status, metrics: m, cancel: cancel, done: make(chan error, 1)}
	go func() { rs.done <- r.Run(ctx) }()
	t.Cleanup(rs.stop)
	return rs
}

func (r *running) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
		}
	})
}

func push(t testing.TB, b *broker.Broker, queue, partition string, payloads ...string) {
	t.Helper()
	items := make([]broker.PushItem, len(payloads))
	for i, p := range payloads {
		items[i] = broker.PushItem{Queue: queue, Partition: partition, Payload: []byte(p)}
	}
	for len(items) > 0 {
		n := min(len(items), 1000)
		if _, err := b.Push(context.Background(), "default", items[:n]); err != nil {
			t.Fatal(err)
		}
		items = items[n:]
	}
}

// waitFor polls until f holds.
func waitFor(t testing.TB, what string, total time.Duration, f func() error) {
	t.Helper()
	if err := testkit.CheckFor(total, 20*time.Millisecond, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func waitCount(t testing.TB, dbURL, q string, want int) {
	t.Helper()
	waitFor(t, q, 60*time.Second, func() error {
		if n := count(t, dbURL, q); n != want {
			return fmt.Errorf("%d rows, want %d", n, want)
		}
		return nil
	})
}

// waitPhase waits for the sink's phase (and error code).
func waitPhase(t testing.TB, r *running, phase, code string) connector.Status {
	t.Helper()
	var st connector.Status
	waitFor(t, "sink phase "+phase+" "+code, 30*time.Second, func() error {
		st = r.status.Get()
		if st.Phase != phase || st.Code != code {
			return fmt.Errorf("phase %s code %s (%s)", st.Phase, st.Code, st.Message)
		}
		return nil
	})
	return st
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// postmasterPID is the process id of the postmaster of the server of
// dbURL: the parent of a backend, read while that backend's connection is
// still open (so not through pgtest.QueryInt, which closes it).
func postmasterPID(t testing.TB, dbURL string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var backend int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", backend))
	if err != nil {
		t.Fatalf("the backend's process (PostgreSQL on another machine?): %v", err)
	}
	f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("/proc/%d/stat: %v", backend, err)
	}
	return ppid
}

// crashPostgres stops the server of dbURL in an immediate shutdown
// (SIGQUIT to the postmaster): every process exits at once, WAL not yet
// written is lost, and the next start runs crash recovery.
func crashPostgres(t testing.TB, pg *pgtest.Server, dbURL string) {
	t.Helper()
	pm := postmasterPID(t, dbURL)
	if err := syscall.Kill(pm, syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the postmaster gone", 30*time.Second, func() error {
		if syscall.Kill(pm, 0) == nil {
			return fmt.Errorf("postmaster %d still runs", pm)
		}
		return nil
	})
	pg.Stop(t) // reaps it
}

// createNums creates the table nums (n int, pad text), keyed by n in
// upsert mode.
func createNums(t testing.TB, db, mode string) {
	t.Helper()
	key := ""
	if mode == "upsert" {
		key = " PRIMARY KEY"
	}
	exec(t, db, `CREATE TABLE nums (n int`+key+`, pad text)`)
}
