package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// Request bodies are bounded three ways: in size (MaxBodyBytes, 413), in
// the time a client may take to send one (BodyReadTimeout, 408), and in the
// memory all bodies in flight may hold together (MaxInflightBodyBytes, 503
// with Retry-After). After a burst of large bodies the memory goes back to
// the operating system.

const (
	// freeAfterBurst is the high-water mark of body bytes in flight after
	// which the memory is handed back to the OS once the burst is over.
	freeAfterBurst = 64 << 20
	// freeInterval spaces those hand-backs (each is a full collection).
	freeInterval = 10 * time.Second
	// chunkStep is the first buffer of a body of unknown length.
	chunkStep = 32 << 10
)

// bodyBudget counts the bytes that request bodies in flight hold, across
// connections.
type bodyBudget struct {
	limit int64

	mu       sync.Mutex
	used     int64
	peak     int64 // high-water mark since the last hand-back
	lastFree time.Time
	freeing  bool
	freeOS   func()        // debug.FreeOSMemory; replaced in tests
	interval time.Duration // freeInterval; shorter in tests
}

func newBodyBudget(limit int64) *bodyBudget {
	return &bodyBudget{limit: limit, freeOS: debug.FreeOSMemory, interval: freeInterval}
}

// tryAcquire takes n bytes if they fit; it never waits.
func (b *bodyBudget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		return false
	}
	b.used += n
	if b.used > b.peak {
		b.peak = b.used
	}
	return true
}

// release gives n bytes back. When a burst of large bodies is over, the
// freed memory is returned to the OS (at most once per freeInterval).
func (b *bodyBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.used > b.peak/16 || b.peak < freeAfterBurst || b.freeing {
		return
	}
	// The burst is over: hand its memory back now, or as soon as the
	// last hand-back is an interval old.
	b.freeing, b.peak = true, b.used
	time.AfterFunc(max(b.interval-time.Since(b.lastFree), 0), func() {
		b.freeOS()
		b.mu.Lock()
		b.freeing, b.lastFree = false, time.Now()
		b.mu.Unlock()
	})
}

// inUse reports the bytes held now.
func (b *bodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// boundedBody is a request body under the read deadline and the budget.
// ServeHTTP installs it and calls done when the handler returns.
type boundedBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	budget *bodyBudget
	held   int64
	ended  bool
}

// Read clears the read deadline once the body has been read to its end,
// so it cannot cut a long request's context short later. After a timeout
// the deadline stays passed: nothing more is read from that connection.
func (b *boundedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.ended {
		b.ended = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (b *boundedBody) reserve(n int64) bool {
	if !b.budget.tryAcquire(n) {
		return false
	}
	b.held += n
	return true
}

func (b *boundedBody) done() {
	b.budget.release(b.held)
	b.held = 0
}

// bound installs a boundedBody on a request that has a body: the client
// has BodyReadTimeout to send it.
func (s *Server) bound(w http.ResponseWriter, r *http.Request) *boundedBody {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil
	}
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout))
	bb := &boundedBody{ReadCloser: r.Body, rc: rc, budget: s.budget}
	r.Body = bb
	return bb
}

// readBodyBytes reads a request body within the limits.
func (s *Server) readBodyBytes(r *http.Request) ([]byte, *broker.Error) {
	limit := s.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	bb, _ := r.Body.(*boundedBody)
	reserve := func(n int64) bool { return bb == nil || bb.reserve(n) }
	if n := r.ContentLength; n > 0 {
		// The length is known and within the limit: one allocation.
		if !reserve(n) {
			return nil, s.busy()
		}
		body := bodyBuffer(n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, s.readError(err)
		}
		return body, nil
	}
	// Unknown length (chunked): the buffer grows, and the budget with it.
	var body []byte
	for {
		if len(body) == cap(body) {
			grow := int64(chunkStep)
			if c := int64(cap(body)); c > 0 {
				grow = min(c, limit+1-c)
			}
			if grow <= 0 {
				return nil, tooLarge(limit)
			}
			if !reserve(grow) {
				return nil, s.busy()
			}
			next := make([]byte, len(body), int64(cap(body))+grow)
			copy(next, body)
			body = next
		}
		n, err := r.Body.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if int64(len(body)) > limit {
			return nil, tooLarge(limit)
		}
		if err == io.EOF {
			return body, nil
		}
		if err != nil {
			return nil, s.readError(err)
		}
	}
}

// busy is the reply when the bodies in flight hold the whole budget.
func (s *Server) busy() *broker.Error {
	return &broker.Error{Code: "overloaded",
		Message: fmt.Sprintf("request bodies in flight already hold %d bytes, the limit of this node; retry after a moment (QUEEN_MAX_INFLIGHT_BODY_BYTES raises the limit)", s.cfg.MaxInflightBodyBytes)}
}

func (s *Server) readError(err error) *broker.Error {
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return &broker.Error{Code: "request_timeout",
			Message: fmt.Sprintf("the request body did not arrive within %v; send it faster or in smaller requests (QUEEN_BODY_READ_TIMEOUT raises the limit)", s.cfg.BodyReadTimeout)}
	}
	return &broker.Error{Code: "invalid_request", Message: "read request body: " + err.Error()}
}
