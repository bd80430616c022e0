package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Requests to queen over HTTP, and the push scenarios' producers.

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
