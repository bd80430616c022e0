package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// Version is reported by /health and /status.
var Version = "0.1.0-dev"

// Config configures the HTTP API.
type Config struct {
	// MaxBodyBytes bounds a request body; larger requests get 413.
	MaxBodyBytes int64
	// BodyReadTimeout bounds the time a client may take to send a body;
	// slower requests get 408 and their connection closes.
	BodyReadTimeout time.Duration
	// MaxInflightBodyBytes bounds the memory all request bodies being read
	// or handled may hold together; past it a request gets 503 with
	// Retry-After. It is at least MaxBodyBytes.
	MaxInflightBodyBytes int64
	Logger               *slog.Logger
	// Auth authenticates requests and names their tenant (authz.go). Nil,
	// or nothing configured in it, means open: tenant "default", admin.
	Auth *Authenticator
	// MetricsToken (QUEEN_METRICS_TOKEN) lets a scraper see every tenant's
	// series on /metrics/prometheus when auth is on (metrics.go).
	MetricsToken string
	// Connectors is this node's connector runtime: the status the
	// connector routes and /status show, and the connector metrics. Nil
	// means connectors do not run in this process (their documents can
	// still be written and read).
	Connectors *connector.Runtime
}

// Server serves the HTTP API (docs/http-api.md) over a broker.
type Server struct {
	b   *broker.Broker
	cfg Config
	log *slog.Logger
	mux *http.ServeMux

	connStore *connector.Store

	reg     *prometheus.Registry
	httpLat *prometheus.HistogramVec
	// patterns are the routes registered, for the test that holds
	// docs/http-api.md to them.
	patterns []string

	budget *bodyBudget // body.go
}

// New builds the HTTP handler for a broker.
func New(b *broker.Broker, cfg Config) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	if cfg.BodyReadTimeout <= 0 {
		cfg.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if cfg.MaxInflightBodyBytes <= 0 {
		cfg.MaxInflightBodyBytes = max(DefaultMaxInflightBodyBytes, cfg.MaxBodyBytes)
	}
	cfg.MaxInflightBodyBytes = max(cfg.MaxInflightBodyBytes, cfg.MaxBodyBytes)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{b: b, cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), connStore: connector.NewStore(b), budget: newBodyBudget(cfg.MaxInflightBodyBytes)}
	s.routes()
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "queen_http_body_bytes_in_flight",
		Help: "Bytes that request bodies being read or handled hold (bounded by QUEEN_MAX_INFLIGHT_BODY_BYTES).",
	}, func() float64 { return float64(s.budget.inUse()) }))
	return s
}

// Defaults of the body limits (Config).
const (
	DefaultBodyReadTimeout      = 20 * time.Second
	DefaultMaxInflightBodyBytes = 256 << 20
)

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if bb := s.bound(w, r); bb != nil {
		defer bb.done()
	}
	rw := &replyWriter{ResponseWriter: w}
	w = rw
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", v, "replied", rw.started)
			if rw.started {
				// Part of a reply is out: a second one would corrupt it.
				// Aborting closes the connection, so the client sees a
				// broken reply, never a wrong one.
				panic(http.ErrAbortHandler)
			}
			writeError(w, &broker.Error{Code: "internal", Message: "internal error; the request changed nothing it had not committed"})
		}
	}()
	r, ok := s.authorize(w, r)
	if !ok {
		return
	}
	if e := s.checkRequestUTF8(r); e != nil { // utf8.go
		writeError(w, e)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// replyWriter remembers whether a reply has started, and its status (for
// the latency metric, metrics.go).
type replyWriter struct {
	http.ResponseWriter
	started bool
	code    int
}

func (w *replyWriter) WriteHeader(code int) {
	if !w.started {
		w.code = code
	}
	w.started = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *replyWriter) Write(b []byte) (int, error) {
	if !w.started {
		w.code = http.StatusOK
	}
	w.started = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *replyWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) routes() {
	s.reg = s.newRegistry()
	m := s.mux
	handle := func(pattern string, h http.HandlerFunc) {
		s.patterns = append(s.patterns, pattern)
		m.HandleFunc(pattern, s.timed(pattern, h))
	}
	handle("POST /api/v1/push", s.handlePush)
	handle("GET /api/v1/pop/queue/{queue}", s.handlePop)
	handle("GET /api/v1/pop/queue/{queue}/partition/{partition}", s.handlePop)
	handle("POST /api/v1/ack", s.handleAck)
	handle("POST /api/v1/ack/batch", s.handleAckBatch)
	handle("POST /api/v1/lease/{leaseId}/extend", s.handleExtend)
	handle("GET /api/v1/dlq", s.handleDLQList)
	handle("POST /api/v1/dlq/requeue", s.handleDLQRequeue)
	handle("DELETE /api/v1/dlq", s.handleDLQDelete)
	handle("POST /api/v1/configure", s.handleConfigure)
	handle("GET /api/v1/resources/queues", s.handleQueues)
	handle("GET /api/v1/resources/queues/{queue}", s.handleQueue)
	handle("DELETE /api/v1/resources/queues/{queue}", s.handleDeleteQueue)
	handle("GET /api/v1/consumer-groups", s.handleGroups)
	handle("GET /api/v1/consumer-groups/{group}", s.handleGroup)
	handle("POST /api/v1/consumer-groups/{group}/queues/{queue}/seek", s.handleSeek)
	handle("POST /api/v1/consumer-groups/{group}/subscription", s.handleSubscription)
	handle("DELETE /api/v1/consumer-groups/{group}", s.handleDeleteGroup)
	handle("DELETE /api/v1/consumer-groups/{group}/queues/{queue}", s.handleDeleteGroup)
	handle("POST /api/v1/transaction", s.handleTransaction)
	handle("GET /api/v1/kv", s.handleKVList)
	handle("GET /api/v1/kv/{key...}", s.handleKVGet)
	handle("PUT /api/v1/kv/{key...}", s.handleKVPut)
	handle("DELETE /api/v1/kv/{key...}", s.handleKVDelete)
	handle("GET /health", s.handleHealth)
	handle("GET /status", s.handleStatus)
	handle("GET /api/v1/status", s.handleStatus)
	s.clusterRoutes(handle)   // cluster.go
	s.connectorRoutes(handle) // connectors.go
	s.patterns = append(s.patterns, "GET /metrics/prometheus")
	m.Handle("GET /metrics/prometheus", s.metricsHandler())
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &broker.Error{Code: "not_found", Message: fmt.Sprintf("no route %s %s; docs/http-api.md lists the routes", r.Method, r.URL.Path)})
	})
}

// tenant returns the tenant of a request: the one its token names, as
// stored by the auth middleware (authz.go). Without auth configured every
// request belongs to tenant "default".
func (s *Server) tenant(r *http.Request) string { return tenantOf(r) }

// writeJSON encodes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, &broker.Error{Code: "internal", Message: "encode reply: " + err.Error()})
		return
	}
	writeRaw(w, status, b)
}

// jsonContentType is the Content-Type of every reply. The header holds this
// one slice: Set and Add replace or grow a header's slice, never write it.
var jsonContentType = []string{"application/json"}

// writeRaw writes b as a JSON reply; the error is the body's write's.
func writeRaw(w http.ResponseWriter, status int, b []byte) error {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	w.WriteHeader(status)
	_, err := w.Write(b)
	return err
}

// replyBufs holds the buffers the hot replies (push, pop, ack) are encoded
// into; a reply's buffer is reused once it has been written.
var replyBufs sync.Pool

// maxPooledReply bounds the buffers kept, so one huge reply does not pin
// its memory.
const maxPooledReply = 1 << 20

// replyBuf returns an empty buffer of at least n bytes.
func replyBuf(n int) []byte {
	if p, _ := replyBufs.Get().(*[]byte); p != nil && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]byte, 0, n)
}

// writePooled writes b (from replyBuf) as the reply and keeps it for
// reuse. Only a write that succeeded is surely done with b: after an error
// (HTTP/2 answers one when the stream closed) a frame may still hold it.
func writePooled(w http.ResponseWriter, status int, b []byte) {
	if err := writeRaw(w, status, b); err == nil && cap(b) <= maxPooledReply {
		b = b[:0]
		replyBufs.Put(&b)
	}
}

type errorBody struct {
	Success   *bool   `json:"success,omitempty"`
	Error     string  `json:"error"`
	Message   string  `json:"message"`
	Field     string  `json:"field,omitempty"`
	Operation *int    `json:"operation,omitempty"`
	Version   *uint64 `json:"version,omitempty"`
}

func writeError(w http.ResponseWriter, e *broker.Error) {
	body := errorBody{Error: e.Code, Message: e.Message, Field: e.Field, Operation: e.Operation, Version: e.CurrentVersion}
	if e.Operation != nil || e.Code == "condition_failed" {
		f := false
		body.Success = &f
	}
	writeJSON(w, statusOf(e), body)
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := broker.AsError(err)
	if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
		// The client went away (or its request's deadline passed): nobody
		// reads the reply, and nothing failed on this side.
		s.log.Debug("request ended by its client", "method", r.Method, "path", r.URL.Path, "err", err)
	} else if statusOf(e) >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, e)
}

// readBody reads a bounded body (body.go) of valid UTF-8 (utf8.go); it
// writes the error reply itself.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, e := s.readBodyBytes(r)
	if e == nil {
		e = checkBodyUTF8(body)
	}
	if e != nil {
		if statusOf(e) == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		if st := statusOf(e); (st == http.StatusServiceUnavailable || st == http.StatusRequestTimeout) && r.ProtoMajor == 1 {
			// The rest of the body is not read: the connection cannot
			// carry another request. (HTTP/2 resets just the stream.)
			w.Header().Set("Connection", "close")
		}
		writeError(w, e)
		return nil, false
	}
	return body, true
}

func tooLarge(limit int64) *broker.Error {
	return &broker.Error{Code: "payload_too_large", Message: fmt.Sprintf("request body is over %d bytes; split it into smaller requests (QUEEN_MAX_BODY_BYTES raises the limit)", limit)}
}

// decode parses a JSON body into v, reporting invalid JSON and wrong types
// with the API's error shape. It writes the error reply itself.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, ok := s.readBody(w, r)
	if !ok {
		return false
	}
	if e := decodeJSON(body, v); e != nil {
		writeError(w, e)
		return false
	}
	return true
}

func decodeJSON(body []byte, v any) *broker.Error {
	// One pass: Unmarshal reports malformed JSON itself (checked before it
	// assigns anything, so a wrong type is never reported for bad JSON).
	if err := json.Unmarshal(body, v); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) || len(body) == 0 {
			return &broker.Error{Code: "invalid_json", Message: "the request body is not valid JSON: " + err.Error()}
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := typeErrorField(body, te)
			return &broker.Error{Code: "invalid_parameter", Field: field, Message: typeErrorMessage(orBody(field), te)}
		}
		var fe *fieldError
		if errors.As(err, &fe) {
			return &broker.Error{Code: "invalid_parameter", Field: fe.field, Message: fe.msg}
		}
		return &broker.Error{Code: "invalid_parameter", Message: err.Error()}
	}
	return nil
}

// typeErrorField names the value of a type error with its indexes
// ("items[3].queue", where encoding/json says "items.queue").
func typeErrorField(body []byte, te *json.UnmarshalTypeError) string {
	if path, inKey, ok := jsonPathAt(body, int(te.Offset)); ok && !inKey && stripIndices(path) == te.Field {
		return path
	}
	return te.Field
}

// typeErrorMessage says what a field must be: a number of the wrong range
// ("offset must be a non-negative integer, got -1") is not a wrong type.
func typeErrorMessage(field string, te *json.UnmarshalTypeError) string {
	want := jsonKind(te.Type.Kind().String())
	if got, ok := strings.CutPrefix(te.Value, "number "); ok && want == "number" {
		switch te.Type.Kind() {
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			return fmt.Sprintf("%s must be an integer from 0 to %d, got %s", field, uint64(math.MaxUint64)>>(64-te.Type.Bits()), got)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			hi := int64(math.MaxInt64) >> (64 - te.Type.Bits())
			return fmt.Sprintf("%s must be an integer from %d to %d, got %s", field, -hi-1, hi, got)
		}
		return fmt.Sprintf("%s must be a number, got %s", field, got)
	}
	return fmt.Sprintf("%s must be a JSON %s, not %s", field, want, te.Value)
}

func orBody(f string) string {
	if f == "" {
		return "the body"
	}
	return f
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "string"
	case "slice", "array":
		return "array"
	case "struct", "map":
		return "object"
	case "bool":
		return "boolean"
	default:
		return "number"
	}
}

type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

// idValue accepts a uint64 written as a JSON string or number.
type idValue struct {
	v   uint64
	set bool
}

func (p *idValue) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	s = strings.Trim(s, `"`)
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return &fieldError{field: "partitionId", msg: fmt.Sprintf("partitionId must be a decimal id, got %s", string(b))}
	}
	p.v, p.set = v, true
	return nil
}

// query parameter helpers; each reports a bad value as invalid_parameter.

// queryGet is r.URL.Query().Get(name) without parsing the query into a
// map: a query with nothing to unescape (no '%' or '+') and no ';' (which
// url.ParseQuery drops a pair for) is read in place.
func queryGet(r *http.Request, name string) string {
	q := r.URL.RawQuery
	if strings.ContainsAny(q, "%+;") {
		return r.URL.Query().Get(name)
	}
	for q != "" {
		var pair string
		pair, q, _ = strings.Cut(q, "&")
		if k, v, _ := strings.Cut(pair, "="); k == name {
			return v
		}
	}
	return ""
}

func qInt(r *http.Request, name string, def, lo, hi int64) (int64, *broker.Error) {
	v := queryGet(r, name)
	if v == "" || v == "null" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, &broker.Error{Code: "invalid_parameter", Field: name, Message: fmt.Sprintf("%s must be an integer, got %q", name, v)}
	}
	if n < lo || n > hi {
		return 0, &broker.Error{Code: "invalid_parameter", Field: name, Message: fmt.Sprintf("%s must be between %d and %d, got %d", name, lo, hi, n)}
	}
	return n, nil
}

func qBool(r *http.Request, name string) (bool, *broker.Error) {
	switch v := queryGet(r, name); v {
	case "", "null", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	default:
		return false, &broker.Error{Code: "invalid_parameter", Field: name, Message: fmt.Sprintf("%s must be true or false, got %q", name, v)}
	}
}

func qStr(r *http.Request, name string) string {
	v := queryGet(r, name)
	if v == "null" {
		return ""
	}
	return v
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	h := s.b.Health()
	role := "follower"
	if h.Leader {
		role = "leader"
	}
	if !h.Ready {
		msg := "this node cannot serve yet: no leader, or a new leader still applying earlier entries"
		if h.Halted != nil {
			msg = h.Halted.Error()
		}
		writeJSON(w, 503, map[string]any{"status": "unavailable", "node": h.Node, "role": role, "version": Version,
			"message": msg})
		return
	}
	writeJSON(w, 200, map[string]any{"status": "healthy", "node": h.Node, "role": role, "version": Version})
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	n := s.b.NodeInfo()
	st := s.b.Stats(s.tenant(r))
	role := "follower"
	if n.Leader {
		role = "leader"
	}
	var members []map[string]any
	for _, m := range n.Members {
		members = append(members, map[string]any{"id": m.ID, "address": m.Address, "suffrage": m.Suffrage})
	}
	writeJSON(w, 200, map[string]any{
		"node": n.Node, "role": role, "version": Version,
		// term and commitIndex are strings, as raft's own stats give them.
		"cluster": map[string]any{"leader": n.LeaderID, "leaderAddress": n.LeaderAddress, "members": members,
			"term": strconv.FormatUint(n.Term, 10), "commitIndex": strconv.FormatUint(n.CommitIndex, 10), "appliedIndex": st.Applied},
		"queues": map[string]any{"count": st.Queues, "messages": st.Messages},
		"pg":     s.pgStatus(r),
		"time":   formatTime(time.Now()),
	})
}

// requestContext bounds a request that is not a long poll.
func requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 60*time.Second)
}
