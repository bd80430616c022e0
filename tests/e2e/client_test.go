package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// M is a JSON object literal.
type M = map[string]any

// reply is one HTTP exchange, kept whole for failure messages.
type reply struct {
	Method string
	Path   string
	Req    []byte
	Status int
	Header http.Header
	Body   []byte
}

func (r *reply) String() string {
	return fmt.Sprintf("%s %s %s\n  → %d %s", r.Method, r.Path, clip(r.Req), r.Status, clip(r.Body))
}

func clip(b []byte) string {
	const max = 1500
	if len(b) > max {
		return string(b[:max]) + fmt.Sprintf("…(%d bytes)", len(b))
	}
	return string(b)
}

// encodeBody turns a request body into bytes: nil is no body, string and
// []byte are sent raw, anything else is JSON-encoded.
func encodeBody(body any) ([]byte, error) {
	switch b := body.(type) {
	case nil:
		return nil, nil
	case string:
		return []byte(b), nil
	case []byte:
		return b, nil
	default:
		return json.Marshal(b)
	}
}

// roundTrip sends one request; it does not fail the test (safe in goroutines).
func (s *server) roundTrip(method, path string, body any) (*reply, error) {
	return s.roundTripCtx(context.Background(), method, path, body)
}

// promptGet requires GET path to answer 200 within d (non-fatal).
func (s *server) promptGet(t testing.TB, path string, d time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	r, err := s.roundTripCtx(ctx, "GET", path, nil)
	if err != nil {
		t.Errorf("GET %s: no reply within %v: %v", path, d, err)
		return false
	}
	if r.Status != 200 {
		t.Errorf("GET %s after %v: want 200:\n%s", path, time.Since(start).Round(time.Millisecond), r)
		return false
	}
	return true
}

func (s *server) roundTripCtx(ctx context.Context, method, path string, body any) (*reply, error) {
	raw, err := encodeBody(body)
	if err != nil {
		return nil, fmt.Errorf("encode %s %s body: %w", method, path, err)
	}
	var rd io.Reader
	if raw != nil {
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("build %s %s: %w", method, path, err)
	}
	if raw != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: read reply: %w", method, path, err)
	}
	return &reply{Method: method, Path: path, Req: raw, Status: resp.StatusCode, Header: resp.Header, Body: rb}, nil
}

// call sends a request and fails the test on a transport error.
func (s *server) call(t testing.TB, method, path string, body any) *reply {
	t.Helper()
	r, err := s.roundTrip(method, path, body)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return r
}

// callJSON sends a request, requires status want and a JSON reply, and decodes
// it into out (when out is not nil).
func (s *server) callJSON(t testing.TB, method, path string, body any, want int, out any) *reply {
	t.Helper()
	r := s.call(t, method, path, body)
	if r.Status != want {
		t.Fatalf("want status %d:\n%s", want, r)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("want content-type application/json, got %q:\n%s", ct, r)
	}
	if out != nil {
		if err := json.Unmarshal(r.Body, out); err != nil {
			t.Fatalf("decode reply into %T: %v\n%s", out, err, r)
		}
	}
	return r
}

// apiError is the API's error body.
type apiError struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	Field   string `json:"field"`
}

// expectError requires status and error code; when field is not "", the
// error's field must contain it.
func (s *server) expectError(t testing.TB, method, path string, body any, status int, code, field string) apiError {
	t.Helper()
	var e apiError
	r := s.callJSON(t, method, path, body, status, &e)
	if code != "" && e.Error != code {
		t.Fatalf("want error %q, got %q:\n%s", code, e.Error, r)
	}
	if e.Message == "" {
		t.Errorf("error reply without a message:\n%s", r)
	}
	if field != "" && !strings.Contains(e.Field, field) {
		t.Fatalf("want error field naming %q, got field %q:\n%s", field, e.Field, r)
	}
	return e
}

// ---- push

type pushItem struct {
	Queue         string `json:"queue"`
	Partition     string `json:"partition,omitempty"`
	Payload       any    `json:"payload"`
	TransactionID string `json:"transactionId,omitempty"`
	TraceID       string `json:"traceId,omitempty"`
}

type pushResult struct {
	Index         int    `json:"index"`
	Status        string `json:"status"`
	TransactionID string `json:"transaction_id"`
	MessageID     string `json:"message_id"`
	PartitionID   string `json:"partition_id"`
	Offset        int64  `json:"offset"`
	QueueName     string `json:"queueName"`
}

// push sends items (a []pushItem, or any body) and requires 201 with one
// result per item.
func (s *server) push(t testing.TB, items any) []pushResult {
	t.Helper()
	var body any = items
	n := -1
	if its, ok := items.([]pushItem); ok {
		body = M{"items": its}
		n = len(its)
	}
	var out []pushResult
	r := s.callJSON(t, "POST", "/api/v1/push", body, http.StatusCreated, &out)
	if n >= 0 && len(out) != n {
		t.Fatalf("push of %d items got %d results:\n%s", n, len(out), r)
	}
	for i, o := range out {
		if o.Index != i {
			t.Fatalf("push result %d has index %d:\n%s", i, o.Index, r)
		}
	}
	return out
}

// pushN pushes n messages {"i": k} to one queue and partition in one request.
func (s *server) pushN(t testing.TB, queue, partition string, n int) []pushResult {
	t.Helper()
	items := make([]pushItem, n)
	for i := range items {
		items[i] = pushItem{Queue: queue, Partition: partition, Payload: M{"i": i}}
	}
	return s.push(t, items)
}

// ---- pop

type message struct {
	ID            string          `json:"id"`
	TransactionID string          `json:"transactionId"`
	TraceID       *string         `json:"traceId"`
	Queue         string          `json:"queue"`
	Partition     string          `json:"partition"`
	PartitionID   string          `json:"partitionId"`
	Offset        int64           `json:"offset"`
	CreatedAt     string          `json:"createdAt"`
	Data          json.RawMessage `json:"data"`
	LeaseID       string          `json:"leaseId"`
	ConsumerGroup string          `json:"consumerGroup"`
	Attempt       int             `json:"attempt"`
	RetryCount    int             `json:"retryCount"`
}

type popReply struct {
	Success           bool      `json:"success"`
	Queue             string    `json:"queue"`
	ConsumerGroup     string    `json:"consumerGroup"`
	LeaseID           string    `json:"leaseId"`
	PartitionsClaimed int       `json:"partitionsClaimed"`
	Messages          []message `json:"messages"`
}

// tryPop pops without failing the test (safe in goroutines). A 204 gives a
// nil popReply.
func (s *server) tryPop(path string) (*popReply, *reply, error) {
	r, err := s.roundTrip("GET", path, nil)
	if err != nil {
		return nil, nil, err
	}
	switch r.Status {
	case http.StatusNoContent:
		if len(r.Body) != 0 {
			return nil, r, fmt.Errorf("204 with a body:\n%s", r)
		}
		return nil, r, nil
	case http.StatusOK:
		var p popReply
		if err := json.Unmarshal(r.Body, &p); err != nil {
			return nil, r, fmt.Errorf("decode pop reply: %v\n%s", err, r)
		}
		if !p.Success || len(p.Messages) == 0 {
			return nil, r, fmt.Errorf("200 pop reply must have success:true and messages:\n%s", r)
		}
		return &p, r, nil
	default:
		return nil, r, fmt.Errorf("pop: want 200 or 204:\n%s", r)
	}
}

func popPath(queue, query string) string {
	p := "/api/v1/pop/queue/" + url.PathEscape(queue)
	if query != "" {
		p += "?" + query
	}
	return p
}

func popPartitionPath(queue, partition, query string) string {
	p := "/api/v1/pop/queue/" + url.PathEscape(queue) + "/partition/" + url.PathEscape(partition)
	if query != "" {
		p += "?" + query
	}
	return p
}

// pop pops from any partition of a queue; query is a raw query string
// ("batch=10&consumerGroup=g"). It returns nil on 204.
func (s *server) pop(t testing.TB, queue, query string) *popReply {
	t.Helper()
	p, _, err := s.tryPop(popPath(queue, query))
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}

// popPartition pops from one partition.
func (s *server) popPartition(t testing.TB, queue, partition, query string) *popReply {
	t.Helper()
	p, _, err := s.tryPop(popPartitionPath(queue, partition, query))
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}

// mustPop requires a 200 with exactly n messages.
func (s *server) mustPop(t testing.TB, queue, query string, n int) *popReply {
	t.Helper()
	p, r, err := s.tryPop(popPath(queue, query))
	if err != nil {
		t.Fatalf("%v", err)
	}
	if p == nil {
		t.Fatalf("want %d messages, got 204 for GET %s", n, popPath(queue, query))
	}
	if len(p.Messages) != n {
		t.Fatalf("want %d messages, got %d:\n%s", n, len(p.Messages), r)
	}
	return p
}

// mustEmpty requires a 204.
func (s *server) mustEmpty(t testing.TB, queue, query string) {
	t.Helper()
	p, r, err := s.tryPop(popPath(queue, query))
	if err != nil {
		t.Fatalf("%v", err)
	}
	if p != nil {
		t.Fatalf("want 204 (nothing to deliver), got %d messages:\n%s", len(p.Messages), r)
	}
}

// ---- ack

type ackReq struct {
	TransactionID string `json:"transactionId,omitempty"`
	PartitionID   string `json:"partitionId"`
	Offset        *int64 `json:"offset,omitempty"`
	Status        string `json:"status"`
	ConsumerGroup string `json:"consumerGroup,omitempty"`
	LeaseID       string `json:"leaseId,omitempty"`
	Error         string `json:"error,omitempty"`
}

type ackResult struct {
	Index         int     `json:"index"`
	TransactionID string  `json:"transactionId"`
	Success       bool    `json:"success"`
	Error         *string `json:"error"`
	LeaseReleased bool    `json:"leaseReleased"`
	DLQ           bool    `json:"dlq"`
}

func (a ackResult) errText() string {
	if a.Error == nil {
		return "<null>"
	}
	return *a.Error
}

// queueModeGroup is the group name Queen reports in queue mode; acks in queue
// mode name no group.
const queueModeGroup = "__QUEUE_MODE__"

// ackFor acknowledges a delivered message by transactionId under its lease.
func ackFor(m message, status string) ackReq {
	a := ackReq{TransactionID: m.TransactionID, PartitionID: m.PartitionID, Status: status, LeaseID: m.LeaseID}
	if m.ConsumerGroup != queueModeGroup {
		a.ConsumerGroup = m.ConsumerGroup
	}
	return a
}

// ack sends POST /api/v1/ack and returns its single result.
func (s *server) ack(t testing.TB, a ackReq) ackResult {
	t.Helper()
	var out []ackResult
	r := s.callJSON(t, "POST", "/api/v1/ack", a, http.StatusOK, &out)
	if len(out) != 1 {
		t.Fatalf("ack: want one result:\n%s", r)
	}
	return out[0]
}

// mustAck requires the ack to succeed.
func (s *server) mustAck(t testing.TB, a ackReq) ackResult {
	t.Helper()
	res := s.ack(t, a)
	if !res.Success {
		t.Fatalf("ack %+v: want success, got error %s", a, res.errText())
	}
	return res
}

// ackBatch sends POST /api/v1/ack/batch; group "" sends no top-level group.
func (s *server) ackBatch(t testing.TB, group string, acks []ackReq) []ackResult {
	t.Helper()
	var out []ackResult
	r := s.callJSON(t, "POST", "/api/v1/ack/batch", ackBatchBody(group, acks), http.StatusOK, &out)
	if len(out) != len(acks) {
		t.Fatalf("ack/batch of %d items got %d results:\n%s", len(acks), len(out), r)
	}
	return out
}

func ackBatchBody(group string, acks []ackReq) M {
	b := M{"acknowledgments": acks}
	if group != "" {
		b["consumerGroup"] = group
	}
	return b
}

// ackAll completes every message of a pop in one batch and requires success.
func (s *server) ackAll(t testing.TB, p *popReply, status string) []ackResult {
	t.Helper()
	acks := make([]ackReq, len(p.Messages))
	for i, m := range p.Messages {
		acks[i] = ackFor(m, status)
	}
	res := s.ackBatch(t, "", acks)
	for i, a := range res {
		if !a.Success {
			t.Fatalf("ack/batch item %d (%+v): want success, got %s", i, acks[i], a.errText())
		}
	}
	return res
}

// ---- resources

type queueSummary struct {
	Name       string `json:"name"`
	Partitions int64  `json:"partitions"`
	Messages   struct {
		Total   int64 `json:"total"`
		Pending int64 `json:"pending"`
	} `json:"messages"`
	CreatedAt string `json:"createdAt"`
}

// queueInfo reads GET /api/v1/resources/queues/{q} (200 required).
func (s *server) queueInfo(t testing.TB, queue string) (queueSummary, M) {
	t.Helper()
	var q queueSummary
	r := s.callJSON(t, "GET", "/api/v1/resources/queues/"+url.PathEscape(queue), nil, http.StatusOK, &q)
	var raw M
	json.Unmarshal(r.Body, &raw)
	return q, raw
}

// queueTotal is a queue's exact message total.
func (s *server) queueTotal(t testing.TB, queue string) int64 {
	t.Helper()
	q, _ := s.queueInfo(t, queue)
	return q.Messages.Total
}

// queues lists GET /api/v1/resources/queues by name.
func (s *server) queues(t testing.TB) map[string]queueSummary {
	t.Helper()
	var out struct {
		Queues []queueSummary `json:"queues"`
	}
	s.callJSON(t, "GET", "/api/v1/resources/queues", nil, http.StatusOK, &out)
	m := map[string]queueSummary{}
	for _, q := range out.Queues {
		m[q.Name] = q
	}
	return m
}

// ---- small utilities

var timeRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)

// parseAPITime requires RFC 3339 UTC with microseconds.
func parseAPITime(t testing.TB, what, s string) time.Time {
	t.Helper()
	if !timeRE.MatchString(s) {
		t.Errorf("%s %q: want RFC 3339 UTC with microseconds (2026-10-03T06:14:43.797508Z)", what, s)
	}
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("%s %q: %v", what, s, err)
	}
	return tm
}

// offsets lists the offsets of messages.
func offsets(ms []message) []int64 {
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.Offset
	}
	return out
}

// dataInts decodes each message's data {"i": k} into k.
func dataInts(t testing.TB, ms []message) []int {
	t.Helper()
	out := make([]int, len(ms))
	for i, m := range ms {
		var d struct {
			I *int `json:"i"`
		}
		if err := json.Unmarshal(m.Data, &d); err != nil || d.I == nil {
			t.Fatalf("message %s data %s: want {\"i\": n}", m.ID, m.Data)
		}
		out[i] = *d.I
	}
	return out
}

func intsEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// percentile of durations (p in [0,100]).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(float64(len(s)-1) * p / 100)
	return s[idx]
}
