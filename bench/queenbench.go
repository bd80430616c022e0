package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fastjson"
)

// queenSystem talks to a queen server over its HTTP API only.
type queenSystem struct {
	cfg     *config
	sys     string   // sysQueen or sysQueenInterval
	base    string   // the first node: configure, health, latency producer
	bases   []string // all nodes given; producers and consumers are spread over them
	rr      atomic.Int64
	client  *http.Client
	version string

	// Set when this program started the server.
	cmd     *exec.Cmd
	tmp     string
	logPath string
	exited  chan struct{}
	waitErr error
	failed  atomic.Bool

	consQueue string
}

func newHTTPClient() *http.Client {
	tr := &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		WriteBufferSize:     64 << 10,
		ReadBufferSize:      64 << 10,
	}
	return &http.Client{Transport: tr}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func newQueenSystem(ctx context.Context, cfg *config, sys string) (*queenSystem, error) {
	q := &queenSystem{cfg: cfg, sys: sys, client: newHTTPClient()}
	if cfg.queenURL != "" {
		for u := range strings.SplitSeq(cfg.queenURL, ",") {
			if u = strings.TrimRight(strings.TrimSpace(u), "/"); u != "" {
				q.bases = append(q.bases, u)
			}
		}
		if len(q.bases) == 0 {
			return nil, errors.New("-queen-url: no URL given")
		}
		for i := len(q.bases) - 1; i >= 0; i-- {
			q.base = q.bases[i]
			if err := q.waitHealthy(ctx, 10*time.Second); err != nil {
				return nil, err
			}
		}
		return q, nil
	}
	if err := q.buildAndStart(ctx); err != nil {
		q.close()
		return nil, err
	}
	return q, nil
}

func (q *queenSystem) buildAndStart(ctx context.Context) error {
	src, err := filepath.Abs(q.cfg.queenSrc)
	if err != nil {
		return fmt.Errorf("queen source dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(src, "cmd", "queen")); err != nil {
		return fmt.Errorf("no queen command to build in %s (want %s/cmd/queen): %w", src, src, err)
	}
	q.tmp, err = os.MkdirTemp(q.cfg.tmpDir, "bench-queen-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	bin := filepath.Join(q.tmp, "queen")
	if q.cfg.queenBin != "" {
		bin = q.cfg.queenBin
	} else {
		t := time.Now()
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/queen")
		build.Dir = src
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("go build ./cmd/queen in %s: %w\n%s", src, err, bytes.TrimSpace(out))
		}
		slog.Info("built queen", "bin", bin, "took", time.Since(t).Round(time.Millisecond))
	}

	httpPort, err := freePort()
	if err != nil {
		return err
	}
	raftPort, err := freePort()
	if err != nil {
		return err
	}
	dataDir := filepath.Join(q.tmp, "data")
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	q.logPath = filepath.Join(q.tmp, "queen.log")
	logf, err := os.Create(q.logPath)
	if err != nil {
		return fmt.Errorf("queen log: %w", err)
	}
	defer logf.Close() // the child has its own copy of the descriptor
	httpAddr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(),
		"QUEEN_HTTP_ADDR="+httpAddr,
		fmt.Sprintf("QUEEN_RAFT_ADDR=127.0.0.1:%d", raftPort),
		"QUEEN_DATA_DIR="+dataDir,
		"QUEEN_FSYNC="+q.fsyncMode(),
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If this process dies, the server goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s serve: %w", bin, err)
	}
	q.cmd = cmd
	q.exited = make(chan struct{})
	go func() {
		q.waitErr = cmd.Wait()
		close(q.exited)
	}()
	q.base = "http://" + httpAddr
	q.bases = []string{q.base}
	if err := q.waitHealthy(ctx, q.cfg.queenStartTimeout); err != nil {
		return fmt.Errorf("%w\nlast lines of %s:\n%s", err, q.logPath, tailFile(q.logPath, 20))
	}
	slog.Info("queen is up", "url", q.base, "pid", cmd.Process.Pid, "version", q.version, "data", dataDir)
	return nil
}

func (q *queenSystem) waitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		if q.exited != nil {
			select {
			case <-q.exited:
				return fmt.Errorf("queen exited before it was healthy: %v", q.waitErr)
			default:
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, q.base+"/health", nil)
		if err != nil {
			cancel()
			return fmt.Errorf("health request: %w", err)
		}
		resp, err := q.client.Do(req)
		if err == nil {
			var buf bytes.Buffer
			_, _ = buf.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				cancel()
				var h struct {
					Status  string `json:"status"`
					Role    string `json:"role"`
					Version string `json:"version"`
				}
				if err := json.Unmarshal(buf.Bytes(), &h); err != nil {
					slog.Warn("GET /health: reply is not the documented JSON", "body", trunc(buf.Bytes(), 200), "err", err)
				}
				q.version = strings.TrimSpace(h.Version + " " + h.Role)
				return nil
			}
			last = fmt.Sprintf("GET /health answered %d: %s", resp.StatusCode, trunc(buf.Bytes(), 200))
		} else {
			last = err.Error()
		}
		cancel()
		if time.Now().After(deadline) {
			return fmt.Errorf("queen at %s not healthy after %s: %s", q.base, timeout, last)
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return ctx.Err()
		}
	}
}

func (q *queenSystem) name() string { return q.sys }

// fsyncMode is the QUEEN_FSYNC the server is started with.
func (q *queenSystem) fsyncMode() string {
	if q.sys == sysQueenInterval {
		return "interval"
	}
	return "always"
}

func (q *queenSystem) serverPID() int {
	if q.cmd != nil && q.cmd.Process != nil {
		return q.cmd.Process.Pid
	}
	return 0
}

func (q *queenSystem) close() error {
	var err error
	if q.cmd != nil && q.cmd.Process != nil {
		select {
		case <-q.exited:
			err = fmt.Errorf("queen had exited during the run: %v", q.waitErr)
			q.failed.Store(true)
		default:
			_ = q.cmd.Process.Signal(syscall.SIGTERM)
			tm := time.NewTimer(20 * time.Second)
			select {
			case <-q.exited:
				if q.waitErr != nil {
					err = fmt.Errorf("queen stopped after SIGTERM with: %v", q.waitErr)
				}
			case <-tm.C:
				_ = q.cmd.Process.Kill()
				<-q.exited
				err = errors.New("queen did not stop within 20s of SIGTERM; killed")
			}
			tm.Stop()
		}
	}
	if q.logPath != "" && (err != nil || q.failed.Load()) {
		fmt.Fprintf(os.Stderr, "last lines of %s:\n%s\n", q.logPath, tailFile(q.logPath, 30))
	}
	if q.tmp != "" {
		if q.cfg.keep {
			fmt.Fprintf(os.Stderr, "queen: data and log kept in %s\n", q.tmp)
		} else if rerr := os.RemoveAll(q.tmp); rerr != nil && err == nil {
			err = fmt.Errorf("remove %s: %w", q.tmp, rerr)
		}
	}
	return err
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func trunc(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// httpError names the exact request and reply, for reports of server bugs.
type httpError struct {
	method, path string
	reqBody      []byte
	status       int
	reply        []byte
	why          string
}

func (e *httpError) Error() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %s", e.method, e.path)
	if len(e.reqBody) > 0 {
		fmt.Fprintf(&sb, " with body %s", trunc(e.reqBody, 300))
	}
	fmt.Fprintf(&sb, " answered %d %s", e.status, trunc(e.reply, 500))
	if e.why != "" {
		fmt.Fprintf(&sb, ": %s", e.why)
	}
	return sb.String()
}

// nextBase picks the node for a new producer or consumer, round robin.
func (q *queenSystem) nextBase() string {
	return q.bases[int(q.rr.Add(1)-1)%len(q.bases)]
}

// do sends one request to the first node.
func (q *queenSystem) do(ctx context.Context, method, path string, body []byte, resp *bytes.Buffer, longPoll bool) (int, error) {
	return q.doAt(ctx, q.base, method, path, body, resp, longPoll)
}

// doAt sends one request to base and reads the whole reply into resp.
// Requests that are not long polls get a 60 s limit.
func (q *queenSystem) doAt(ctx context.Context, base, method, path string, body []byte, resp *bytes.Buffer, longPoll bool) (int, error) {
	if len(q.bases) > 1 {
		path = base + path // name the node in errors
		base = ""
	}
	ctx, cancel := requestLimit(ctx, longPoll)
	defer cancel()
	var rd *bytes.Reader
	var req *http.Request
	var err error
	if body != nil {
		rd = bytes.NewReader(body)
		req, err = http.NewRequestWithContext(ctx, method, base+path, rd)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, base+path, nil)
	}
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	r, err := q.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	resp.Reset()
	_, err = resp.ReadFrom(r.Body)
	r.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("%s %s: read reply: %w", method, path, err)
	}
	return r.StatusCode, nil
}

// requestLimit gives a request that is not a long poll 60 s.
func requestLimit(ctx context.Context, longPoll bool) (context.Context, context.CancelFunc) {
	if longPoll {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 60*time.Second)
}

// newRaw returns a lean connection to base under -queen-client raw, else nil
// (the shared net/http client is used). parseFlags refuses raw with a base
// that is not plain http, and a server the bench starts is plain http.
func (q *queenSystem) newRaw(base string) *rawConn {
	if q.cfg.queenClient != "raw" {
		return nil
	}
	return &rawConn{host: strings.TrimPrefix(base, "http://")}
}

// exchange sends one request through rc when there is one, else through
// doAt. The limits are doAt's.
func (q *queenSystem) exchange(ctx context.Context, rc *rawConn, base, method, path string, body []byte, resp *bytes.Buffer, longPoll bool) (int, error) {
	if rc == nil {
		return q.doAt(ctx, base, method, path, body, resp, longPoll)
	}
	ctx, cancel := requestLimit(ctx, longPoll)
	defer cancel()
	st, err := rc.do(ctx, method, path, body, resp)
	if err != nil && len(q.bases) > 1 {
		err = fmt.Errorf("%s: %w", base, err)
	}
	return st, err
}

// fail marks the run as failed (so close prints the tail of queen's log) and returns err.
func (q *queenSystem) fail(err error) error {
	if err != nil && !errors.Is(err, context.Canceled) {
		q.failed.Store(true)
	}
	return err
}

func (q *queenSystem) configure(ctx context.Context, queue string) error {
	body := fmt.Appendf(nil, `{"queue":%q,"options":{"leaseTime":300}}`, queue)
	var resp bytes.Buffer
	st, err := q.do(ctx, http.MethodPost, "/api/v1/configure", body, &resp, false)
	if err != nil {
		return err
	}
	if st != http.StatusOK {
		return &httpError{method: "POST", path: "/api/v1/configure", reqBody: body, status: st, reply: resp.Bytes(), why: "want 200"}
	}
	var rep struct {
		Configured bool   `json:"configured"`
		Queue      string `json:"queue"`
	}
	if err := json.Unmarshal(resp.Bytes(), &rep); err != nil || !rep.Configured || rep.Queue != queue {
		return &httpError{method: "POST", path: "/api/v1/configure", reqBody: body, status: st, reply: resp.Bytes(),
			why: fmt.Sprintf("want {\"configured\":true,\"queue\":%q,…} (decode error: %v)", queue, err)}
	}
	return nil
}

func (q *queenSystem) queueName(kind string) string {
	return "bench-" + q.cfg.runID + "-" + kind
}

// queenProducer sends a batch as one POST /api/v1/push with n items.
type queenProducer struct {
	q        *queenSystem
	base     string
	prefixes [][]byte // per partition: {"queue":"…","partition":"p<i>",
	ids      bool     // a transactionId per item (-push-ids); else the server makes one
	payload  []byte
	next     int
	body     []byte
	resp     bytes.Buffer
	raw      *rawConn // -queen-client raw
}

var queuedMark = []byte(`"queued"`)

func (q *queenSystem) newProducer(queue string, i, partitions, batch int, payload []byte, ids bool) *queenProducer {
	pre := make([][]byte, partitions)
	for p := range pre {
		pre[p] = fmt.Appendf(nil, `{"queue":%q,"partition":"p%d",`, queue, p)
	}
	base := q.nextBase()
	return &queenProducer{q: q, base: base, prefixes: pre, payload: payload, ids: ids, next: i * 7919,
		body: make([]byte, 0, batch*(len(payload)+120)+32), raw: q.newRaw(base)}
}

func (p *queenProducer) send(ctx context.Context, n int) error {
	b := append(p.body[:0], `{"items":[`...)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, p.prefixes[p.next%len(p.prefixes)]...)
		p.next++
		if p.ids {
			b = append(b, `"transactionId":"`...)
			b = append(b, newTxID()...)
			b = append(b, `",`...)
		}
		b = append(b, `"payload":`...)
		b = append(b, p.payload...)
		b = append(b, '}')
	}
	b = append(b, `]}`...)
	p.body = b
	st, err := p.q.exchange(ctx, p.raw, p.base, http.MethodPost, "/api/v1/push", b, &p.resp, false)
	if err != nil {
		return p.q.fail(err)
	}
	if st != http.StatusCreated {
		return p.q.fail(&httpError{method: "POST", path: "/api/v1/push", reqBody: b, status: st, reply: p.resp.Bytes(), why: "want 201"})
	}
	// Cheap check on the hot path; decode only when it does not add up.
	if c := bytes.Count(p.resp.Bytes(), queuedMark); c != n {
		var items []struct {
			Index  int    `json:"index"`
			Status string `json:"status"`
		}
		err := json.Unmarshal(p.resp.Bytes(), &items)
		return p.q.fail(&httpError{method: "POST", path: "/api/v1/push", reqBody: b, status: st, reply: p.resp.Bytes(),
			why: fmt.Sprintf("want %d items with status \"queued\", found %d (decoded %d items, err %v)", n, c, len(items), err)})
	}
	return nil
}

func (p *queenProducer) close() {
	if p.raw != nil {
		p.raw.close()
	}
}

func (q *queenSystem) push(ctx context.Context, sc scenario, m *cpuMeter) result {
	queue := q.queueName(fmt.Sprintf("push-b%d-s%d-p%d", sc.batch, sc.size, sc.partitions))
	if err := q.configure(ctx, queue); err != nil {
		return result{err: q.fail(err)}
	}
	payload := makePayload(sc.size)
	pid := q.serverPID()
	var disk0 int64
	if pid > 0 && q.cfg.pushWindow > 0 {
		if _, wb, err := procIO(pid); err == nil {
			disk0 = wb
		}
	}
	r := runPush(ctx, q.cfg, m, sc.clients, sc.batch, func(i int) (producer, error) {
		return q.newProducer(queue, i, sc.partitions, sc.batch, payload, sc.ids), nil
	})
	// With -push-window (a long push), also what the server wrote to the
	// disk per payload byte. It counts the warm-up and the writes still
	// queued at the end, so it is a close figure, not an exact one.
	if pid > 0 && q.cfg.pushWindow > 0 && r.err == nil && r.msgs > 0 {
		if _, wb, err := procIO(pid); err == nil && disk0 > 0 {
			r.detail += fmt.Sprintf("; the server wrote %.2f bytes to the disk per payload byte", float64(wb-disk0)/float64(r.msgs*int64(sc.size)))
		}
	}
	// The queue goes with its scenario, as the stream does on the JetStream
	// side: the next scenario should not run beside the compaction of this
	// one's data.
	if err := q.deleteQueue(ctx, queue); err != nil && r.err == nil {
		r.err = q.fail(err)
	}
	return r
}

func (q *queenSystem) deleteQueue(ctx context.Context, queue string) error {
	path := "/api/v1/resources/queues/" + url.PathEscape(queue)
	var resp bytes.Buffer
	st, err := q.do(ctx, http.MethodDelete, path, nil, &resp, false)
	if err != nil {
		return err
	}
	if st != http.StatusOK {
		return &httpError{method: "DELETE", path: path, status: st, reply: resp.Bytes(), why: "want 200"}
	}
	return nil
}

func (q *queenSystem) prefill(ctx context.Context) error {
	q.consQueue = q.queueName("consume")
	if err := q.configure(ctx, q.consQueue); err != nil {
		return q.fail(err)
	}
	payload := makePayload(30)
	return runFill(ctx, q.cfg, q.cfg.prefill, 100, func(i int) (producer, error) {
		return q.newProducer(q.consQueue, i, q.cfg.consPartitions, 100, payload, false), nil
	})
}

type popMessage struct {
	TransactionID string          `json:"transactionId"`
	PartitionID   string          `json:"partitionId"`
	LeaseID       string          `json:"leaseId"`
	Attempt       int             `json:"attempt"`
	Data          json.RawMessage `json:"data"`
}

type popReply struct {
	Success  bool         `json:"success"`
	LeaseID  string       `json:"leaseId"`
	Messages []popMessage `json:"messages"`
}

type ackItem struct {
	Index   int     `json:"index"`
	Success bool    `json:"success"`
	Error   *string `json:"error"`
}

// The consumers decode replies with fastjson, a validating parser without
// reflection: with encoding/json the bench's own decoding took about 40% of
// its CPU in pop+ack, on the same two cores as the server. TestReplyDecoders
// checks that both decoders give the same values.

// decodePopReply parses a pop reply into r, reusing its slices. Data is
// copied only when withData is set (the latency scenario reads it).
func decodePopReply(p *fastjson.Parser, body []byte, r *popReply, withData bool) error {
	v, err := p.ParseBytes(body)
	if err != nil {
		return err
	}
	r.Success = v.GetBool("success")
	r.LeaseID = string(v.GetStringBytes("leaseId"))
	r.Messages = r.Messages[:0]
	var arr []*fastjson.Value
	if mv := v.Get("messages"); mv != nil && mv.Type() != fastjson.TypeNull {
		if arr, err = mv.Array(); err != nil {
			return fmt.Errorf("messages: %w", err)
		}
	}
	for _, m := range arr {
		if m.Type() != fastjson.TypeObject {
			return fmt.Errorf("message is %s, not an object", m.Type())
		}
		pm := popMessage{
			TransactionID: string(m.GetStringBytes("transactionId")),
			PartitionID:   string(m.GetStringBytes("partitionId")),
			LeaseID:       string(m.GetStringBytes("leaseId")),
			Attempt:       m.GetInt("attempt"),
		}
		if withData {
			if d := m.Get("data"); d != nil {
				pm.Data = d.MarshalTo(nil)
			}
		}
		r.Messages = append(r.Messages, pm)
	}
	return nil
}

// decodeAckReply parses an ack/batch reply into acks, reusing the slice.
func decodeAckReply(p *fastjson.Parser, body []byte, acks []ackItem) ([]ackItem, error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return acks, err
	}
	arr, err := v.Array()
	if err != nil {
		return acks, err
	}
	for _, a := range arr {
		it := ackItem{Index: a.GetInt("index"), Success: a.GetBool("success")}
		if e := a.Get("error"); e != nil && e.Type() == fastjson.TypeString {
			s := string(e.GetStringBytes())
			it.Error = &s
		}
		acks = append(acks, it)
	}
	return acks, nil
}

// queenConsumer: GET pop (batch, partitions, consumerGroup, subscriptionMode=all),
// then one POST /api/v1/ack/batch with status completed for every message.
type queenConsumer struct {
	q       *queenSystem
	base    string
	popPath string
	group   string
	resp    bytes.Buffer
	body    []byte
	reply   popReply
	acks    []ackItem
	parser  fastjson.Parser
	raw     *rawConn // -queen-client raw
}

func (q *queenSystem) newConsumer(queue, group string) *queenConsumer {
	v := url.Values{}
	v.Set("batch", strconv.Itoa(q.cfg.popBatch))
	v.Set("partitions", strconv.Itoa(q.cfg.popPartitions))
	v.Set("consumerGroup", group)
	v.Set("subscriptionMode", "all")
	base := q.nextBase()
	return &queenConsumer{q: q, base: base, group: group, raw: q.newRaw(base),
		popPath: "/api/v1/pop/queue/" + url.PathEscape(queue) + "?" + v.Encode(),
		body:    make([]byte, 0, 64+q.cfg.popBatch*160)}
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			b, _ := json.Marshal(s)
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func (c *queenConsumer) cycle(ctx context.Context) (int, int, error) {
	q := c.q
	st, err := q.exchange(ctx, c.raw, c.base, http.MethodGet, c.popPath, nil, &c.resp, false)
	if err != nil {
		return 0, 0, q.fail(err)
	}
	if st == http.StatusNoContent {
		return 0, 0, nil
	}
	if st != http.StatusOK {
		return 0, 0, q.fail(&httpError{method: "GET", path: c.popPath, status: st, reply: c.resp.Bytes(), why: "want 200 or 204"})
	}
	if err := decodePopReply(&c.parser, c.resp.Bytes(), &c.reply, false); err != nil {
		return 0, 0, q.fail(&httpError{method: "GET", path: c.popPath, status: st, reply: c.resp.Bytes(), why: "decode: " + err.Error()})
	}
	msgs := c.reply.Messages
	if len(msgs) == 0 {
		return 0, 0, nil
	}
	if err := c.ackAll(ctx, msgs, st); err != nil {
		return 0, 0, err
	}
	redelivered := 0
	for _, m := range msgs {
		if m.Attempt > 1 {
			redelivered++
		}
	}
	return len(msgs), redelivered, nil
}

// ackAll acknowledges msgs of the pop reply in c.reply (completed) and
// checks every entry of the answer. popStatus is the pop's HTTP status, for
// the error of a message that cannot be acknowledged.
func (c *queenConsumer) ackAll(ctx context.Context, msgs []popMessage, popStatus int) error {
	b, err := c.ackBody(c.body[:0], msgs, popStatus)
	if err != nil {
		return err
	}
	c.body = b
	return c.postAck(ctx, b, len(msgs))
}

// ackBody appends to dst the ack/batch request that completes msgs of the
// pop reply in c.reply.
func (c *queenConsumer) ackBody(dst []byte, msgs []popMessage, popStatus int) ([]byte, error) {
	q := c.q
	b := append(dst, '{')
	if c.group != "" {
		b = append(b, `"consumerGroup":`...)
		b = appendJSONString(b, c.group)
		b = append(b, ',')
	}
	b = append(b, `"acknowledgments":[`...)
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		lease := m.LeaseID
		if lease == "" {
			lease = c.reply.LeaseID
		}
		if m.TransactionID == "" || m.PartitionID == "" || lease == "" {
			return b, q.fail(&httpError{method: "GET", path: c.popPath, status: popStatus, reply: c.resp.Bytes(),
				why: fmt.Sprintf("message %d lacks transactionId, partitionId or leaseId", i)})
		}
		b = append(b, `{"transactionId":`...)
		b = appendJSONString(b, m.TransactionID)
		b = append(b, `,"partitionId":`...)
		b = appendJSONString(b, m.PartitionID)
		b = append(b, `,"leaseId":`...)
		b = appendJSONString(b, lease)
		b = append(b, `,"status":"completed"}`...)
	}
	return append(b, `]}`...), nil
}

// postAck sends the ack/batch request b of n messages and checks that
// every entry of the answer succeeded.
func (c *queenConsumer) postAck(ctx context.Context, b []byte, n int) error {
	q := c.q
	st, err := q.exchange(ctx, c.raw, c.base, http.MethodPost, "/api/v1/ack/batch", b, &c.resp, false)
	if err != nil {
		return q.fail(err)
	}
	if st != http.StatusOK {
		return q.fail(&httpError{method: "POST", path: "/api/v1/ack/batch", reqBody: b, status: st, reply: c.resp.Bytes(), why: "want 200"})
	}
	if c.acks, err = decodeAckReply(&c.parser, c.resp.Bytes(), c.acks[:0]); err != nil {
		return q.fail(&httpError{method: "POST", path: "/api/v1/ack/batch", reqBody: b, status: st, reply: c.resp.Bytes(), why: "decode: " + err.Error()})
	}
	if len(c.acks) != n {
		return q.fail(&httpError{method: "POST", path: "/api/v1/ack/batch", reqBody: b, status: st, reply: c.resp.Bytes(),
			why: fmt.Sprintf("want %d entries, got %d", n, len(c.acks))})
	}
	for _, a := range c.acks {
		if !a.Success {
			e := "<nil>"
			if a.Error != nil {
				e = *a.Error
			}
			return q.fail(&httpError{method: "POST", path: "/api/v1/ack/batch", reqBody: b, status: st, reply: c.resp.Bytes(),
				why: fmt.Sprintf("entry %d not successful (error %s)", a.Index, e)})
		}
	}
	return nil
}

func (c *queenConsumer) close() {
	if c.raw != nil {
		c.raw.close()
	}
}

func (q *queenSystem) popAck(ctx context.Context, sc scenario, m *cpuMeter) result {
	return runConsume(ctx, q.cfg, m, []string{"g" + strconv.Itoa(sc.clients)}, sc.clients, int64(q.cfg.prefill),
		func(g string, _ int) (consumer, error) { return q.newConsumer(q.consQueue, g), nil })
}

func (q *queenSystem) fanOut(ctx context.Context, sc scenario, m *cpuMeter) result {
	return runConsume(ctx, q.cfg, m, fanGroupNames(q.cfg, sc), fanPerGroup(q.cfg, sc), int64(q.cfg.prefill),
		func(g string, _ int) (consumer, error) { return q.newConsumer(q.consQueue, g), nil })
}

// latencyAckers is how many acknowledgements of the latency consumer may
// be waiting for their answers at once.
const latencyAckers = 8

func (q *queenSystem) latency(ctx context.Context, m *cpuMeter) result {
	queue := q.queueName("latency")
	if err := q.configure(ctx, queue); err != nil {
		return result{err: q.fail(err)}
	}
	prefix := fmt.Appendf(nil, `{"items":[{"queue":%q,"partition":"p0","payload":`, queue)
	// -latency-ack explicit: the pop leases, and the batch is acknowledged
	// after its receive times are taken; none: autoAck, whose pop is an
	// acknowledgement and so durable before its reply.
	explicit := q.cfg.latAck == latencyAckExplicit
	popPath := "/api/v1/pop/queue/" + url.PathEscape(queue) + "?batch=100&wait=true&timeout=30000"
	if !explicit {
		popPath += "&autoAck=true"
	}

	startRecv := func(ctx context.Context, onMsg func([]byte)) (func() error, error) {
		done := make(chan error, 1)
		go func() {
			// With several nodes the consumer reads from the last one and
			// the producer writes to the first: the latency crosses nodes.
			recvBase := q.bases[len(q.bases)-1]
			c := &queenConsumer{q: q, base: recvBase, popPath: popPath, raw: q.newRaw(recvBase)}
			defer c.close()
			// Acknowledgements go out while the next pop already waits, each
			// without waiting for the answers to the ones before it (as
			// nats.go's Ack does not wait for the server), on up to
			// latencyAckers connections of their own. An ack releases its
			// batch's lease on the partition and wakes that pop; waiting for
			// each ack's answer (its fsync) before sending the next queued
			// them behind each other whenever one took longer than the gap
			// between messages.
			acks := make(chan []byte)
			var (
				ackWG   sync.WaitGroup
				ackFail firstErr
			)
			if explicit {
				for range latencyAckers {
					a := &queenConsumer{q: q, base: recvBase, popPath: popPath, raw: q.newRaw(recvBase)}
					ackWG.Go(func() {
						defer a.close()
						for b := range acks {
							// Not cancelled with the run: the last batch is acknowledged too.
							ackFail.set(a.postAck(context.WithoutCancel(ctx), b, bytes.Count(b, []byte(`"transactionId"`))))
						}
					})
				}
			}
			finish := func(err error) {
				if explicit {
					close(acks)
					ackWG.Wait()
					if err == nil {
						err = ackFail.err
					}
				}
				done <- err
			}
			// The end of the run cancels the pending pop: not a failure.
			stop := func(err error) {
				if ctx.Err() != nil {
					finish(nil)
					return
				}
				finish(q.fail(err))
			}
			for {
				st, err := q.exchange(ctx, c.raw, c.base, http.MethodGet, c.popPath, nil, &c.resp, true)
				if err != nil {
					stop(err)
					return
				}
				if st == http.StatusNoContent {
					continue
				}
				if st != http.StatusOK {
					stop(&httpError{method: "GET", path: popPath, status: st, reply: c.resp.Bytes(), why: "want 200 or 204"})
					return
				}
				if err := decodePopReply(&c.parser, c.resp.Bytes(), &c.reply, true); err != nil {
					stop(&httpError{method: "GET", path: popPath, status: st, reply: c.resp.Bytes(), why: "decode: " + err.Error()})
					return
				}
				for _, m := range c.reply.Messages {
					onMsg(m.Data)
				}
				if explicit && len(c.reply.Messages) > 0 {
					b, err := c.ackBody(nil, c.reply.Messages, st)
					if err != nil {
						finish(err)
						return
					}
					acks <- b
				}
			}
		}()
		return func() error { return <-done }, nil
	}
	freeRaw := make(chan *rawConn, 64)
	defer func() {
		for {
			select {
			case rc := <-freeRaw:
				rc.close()
			default:
				return
			}
		}
	}()
	send := func(ctx context.Context, payload []byte) error {
		body := make([]byte, 0, len(prefix)+len(payload)+4)
		body = append(body, prefix...)
		body = append(body, payload...)
		body = append(body, `}]}`...)
		var resp bytes.Buffer
		// Sends overlap: each takes a free lean connection, or makes one.
		var rc *rawConn
		select {
		case rc = <-freeRaw:
		default:
			rc = q.newRaw(q.base)
		}
		st, err := q.exchange(ctx, rc, q.base, http.MethodPost, "/api/v1/push", body, &resp, false)
		if rc != nil {
			select {
			case freeRaw <- rc:
			default:
				rc.close()
			}
		}
		if err != nil {
			return q.fail(err)
		}
		if st != http.StatusCreated || !bytes.Contains(resp.Bytes(), queuedMark) {
			return q.fail(&httpError{method: "POST", path: "/api/v1/push", reqBody: body, status: st, reply: resp.Bytes(), why: "want 201 with status \"queued\""})
		}
		return nil
	}
	return runLatency(ctx, q.cfg, m, startRecv, send)
}
