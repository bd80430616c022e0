package pgconn

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// queenBin is the server binary TestMain builds.
var queenBin string

func TestMain(m *testing.M) {
	bin, remove, err := testkit.BuildQueen()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgconn:", err)
		os.Exit(1)
	}
	queenBin = bin
	code := pgtest.Main(m)
	remove()
	os.Exit(code)
}

// encryptionKey is every node's QUEEN_ENCRYPTION_KEY (connector passwords
// are sealed with it).
var encryptionKey = strings.Repeat("e7", 32)

// trials is the number of kill trials: def, short under -short,
// QUEEN_TRIALS when set.
func trials(def, short int) int {
	if v, err := strconv.Atoi(os.Getenv("QUEEN_TRIALS")); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return short
	}
	return def
}

// M is a JSON object.
type M = map[string]any

var httpc = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}}

// proc is one `queen serve` process; it keeps its ports and data
// directory across kills and restarts.
type proc struct {
	t        testing.TB
	id       string
	httpAddr string
	raftAddr string
	dataDir  string
	logPath  string
	env      []string

	node testkit.Node
}

func (p *proc) base() string { return "http://" + p.httpAddr }

func (p *proc) queen() *testkit.Queen { return p.node.Queen() }

func (p *proc) alive() bool { return p.node.Alive() }

// start starts the process on its ports and data with p.env as it is now.
func (p *proc) start() {
	p.t.Helper()
	p.node.Start(p.t, func() *testkit.Queen {
		return &testkit.Queen{Bin: queenBin, Name: p.id, HTTPAddr: p.httpAddr, RaftAddr: p.raftAddr,
			DataDir: p.dataDir, LogPath: p.logPath}
	}, append([]string{"QUEEN_NODE_ID=" + p.id, "QUEEN_LOG_LEVEL=warn", "QUEEN_ENCRYPTION_KEY=" + encryptionKey,
		"QUEEN_PG_RELOAD_MS=500", "QUEEN_PG_LEASE_TTL_MS=3000"}, p.env...))
}

// kill is kill -9: the process gets no chance to give anything back.
func (p *proc) kill() { p.node.Signal(p.t, p.id, syscall.SIGKILL, 15*time.Second) }

// restart starts a killed process again on its data and waits until it
// serves.
func (p *proc) restart(t testing.TB) {
	t.Helper()
	if p.alive() {
		t.Fatalf("%s: restart while running", p.id)
	}
	p.start()
	waitHealthy(t, []*proc{p}, 30*time.Second)
}

func (p *proc) logTail() string { return testkit.LogTail(p.logPath, 8000) }

// startNodes starts size processes forming one cluster (one process: a
// single-node broker) and waits until they serve; they are killed when the
// test ends, and their logs printed if it failed.
func startNodes(t *testing.T, size int, env ...string) []*proc {
	t.Helper()
	addrs := testkit.FreeAddrs(t, 2*size)
	var procs []*proc
	var peers []string
	for i := 0; i < size; i++ {
		dir := t.TempDir()
		p := &proc{t: t, id: fmt.Sprintf("n%d", i+1), httpAddr: addrs[2*i], raftAddr: addrs[2*i+1],
			dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "queen.log"), env: append([]string(nil), env...)}
		peers = append(peers, p.id+"="+p.raftAddr)
		procs = append(procs, p)
	}
	for _, p := range procs {
		if size > 1 {
			p.env = append(p.env, "QUEEN_PEERS="+strings.Join(peers, ","))
		}
		p.start()
	}
	t.Cleanup(func() {
		for _, p := range procs {
			if p.alive() {
				p.kill()
			}
		}
		if t.Failed() {
			for _, p := range procs {
				t.Logf("log of %s:\n%s", p.id, p.logTail())
			}
		}
	})
	waitHealthy(t, procs, 30*time.Second)
	return procs
}

// waitHealthy waits until every live process answers /health 200 and one
// of them is the leader.
func waitHealthy(t testing.TB, procs []*proc, within time.Duration) {
	t.Helper()
	err := testkit.CheckFor(within, 20*time.Millisecond, func() error {
		leaders := 0
		for _, p := range procs {
			if !p.alive() {
				continue
			}
			code, h, b, err := testkit.GetHealth(httpc, p.base(), 0)
			if err != nil || code != 200 {
				return fmt.Errorf("%s: /health %d %s %v", p.id, code, b, err)
			}
			if h.Role == "leader" {
				leaders++
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d leaders", leaders)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("not serving after %v: %v", within, err)
	}
}

// call sends a JSON request and returns the status and body.
func call(method, url string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// mustCall fails the test unless the request answers want.
func mustCall(t testing.TB, method, url string, body any, want int) []byte {
	t.Helper()
	code, b, err := call(method, url, body)
	if err != nil || code != want {
		t.Fatalf("%s %s: %d %s (%v), want %d", method, url, code, b, err, want)
	}
	return b
}

// connectorView is what the tests read of GET /api/v1/connectors/{name}.
type connectorView struct {
	Status struct {
		Phase    string `json:"phase"`
		Code     string `json:"code"`
		Message  string `json:"message"`
		Messages int    `json:"messages"`
	} `json:"status"`
	State *struct {
		Pointer json.RawMessage `json:"pointer"`
		Lease   *struct {
			Node string `json:"node"`
		} `json:"lease"`
	} `json:"state"`
}

// connector reads a connector through p; ok is false when p did not answer.
func connector(p *proc, name string) (v connectorView, ok bool) {
	code, b, err := call("GET", p.base()+"/api/v1/connectors/"+name, nil)
	if err != nil || code != 200 {
		return v, false
	}
	return v, json.Unmarshal(b, &v) == nil
}

// waitPhase waits until p shows the connector in phase; a connector in
// phase error fails the test at once.
func waitPhase(t testing.TB, p *proc, name, phase string, within time.Duration) connectorView {
	t.Helper()
	var v connectorView
	err := testkit.CheckFor(within, 20*time.Millisecond, func() error {
		var ok bool
		if v, ok = connector(p, name); !ok {
			return fmt.Errorf("%s did not answer", p.id)
		}
		if v.Status.Phase == "error" {
			t.Fatalf("%s on %s: error %s: %s", name, p.id, v.Status.Code, v.Status.Message)
		}
		if v.Status.Phase != phase {
			return fmt.Errorf("phase %q", v.Status.Phase)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s on %s: %v", name, p.id, err)
	}
	return v
}

// sourceDoc is a source document for table → queue in database db.
func sourceDoc(pg *pgtest.Server, db string, tables []M, extra M) M {
	src := M{"tables": tables}
	for k, v := range extra {
		src[k] = v
	}
	return M{"kind": "source", "connection": connection(pg, db), "source": src}
}

// connection is a connection object with the password as a field (sealed
// by the broker).
func connection(pg *pgtest.Server, db string) M {
	return M{"host": "127.0.0.1", "port": pg.Port(), "database": db, "user": "postgres",
		"password": pgtest.Password, "sslMode": "disable"}
}

// msg is a popped message; ev its data as a change event.
type msg struct {
	TransactionID string          `json:"transactionId"`
	Partition     string          `json:"partition"`
	Data          json.RawMessage `json:"data"`
	ev            event
}

type event struct {
	Op     string                     `json:"op"`
	Table  string                     `json:"table"`
	Key    map[string]json.RawMessage `json:"key"`
	After  map[string]json.RawMessage `json:"after"`
	Before map[string]json.RawMessage `json:"before"`
	LSN    string                     `json:"lsn"`
	Xid    *int64                     `json:"xid"`
	TS     string                     `json:"ts"`
	Seq    int                        `json:"seq"`
}

// pop pops one batch of queue for group through p (autoAck); nil when
// nothing came within the long poll, an error when p did not answer.
func pop(p *proc, queue, group string) ([]msg, error) {
	url := fmt.Sprintf("%s/api/v1/pop/queue/%s?batch=10000&partitions=10000&consumerGroup=%s&subscriptionMode=all&autoAck=true&wait=true&timeout=500",
		p.base(), queue, group)
	code, b, err := call("GET", url, nil)
	if err != nil {
		return nil, err
	}
	switch code {
	case 204:
		return nil, nil
	case 200:
	default:
		return nil, fmt.Errorf("pop: %d %s", code, b)
	}
	var r struct {
		Messages []msg `json:"messages"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("pop reply %.200s: %w", b, err)
	}
	for i := range r.Messages {
		if err := json.Unmarshal(r.Messages[i].Data, &r.Messages[i].ev); err != nil {
			return nil, fmt.Errorf("event %s: %w", r.Messages[i].Data, err)
		}
	}
	return r.Messages, nil
}

// drainUntil pops through the live procs until a message of partition
// marker has arrived and then a long poll comes back empty.
func drainUntil(t testing.TB, procs []*proc, queue, group, marker string, within time.Duration) []msg {
	t.Helper()
	var out []msg
	seen := false
	deadline := time.Now().Add(within)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: marker %q not seen after %v (%d messages)", queue, marker, within, len(out))
		}
		p := procs[i%len(procs)]
		if !p.alive() {
			continue
		}
		ms, err := pop(p, queue, group)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for _, m := range ms {
			seen = seen || m.Partition == marker
		}
		out = append(out, ms...)
		if seen && len(ms) == 0 {
			return out
		}
	}
}

// lsnOf parses an event's lsn.
func lsnOf(t testing.TB, m msg) uint64 {
	t.Helper()
	l, err := pglogrepl.ParseLSN(m.ev.LSN)
	if err != nil {
		t.Fatalf("lsn of %s: %v", m.Data, err)
	}
	return uint64(l)
}

// pgConnect opens a connection closed when the test ends.
func pgConnect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// queryInt runs a query of one integer.
func queryInt(t testing.TB, url, q string) int { t.Helper(); return pgtest.QueryInt(t, url, q) }

// rowsText is every row of a query, each as its text form, in order.
func rowsText(t testing.TB, url, q string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return out
}
