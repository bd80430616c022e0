package httpapi

import "sync"

// Push bodies of tens of KiB to a MiB (a batch of 1 KiB messages is about
// 100 KiB) are read into buffers kept between requests, in size classes of
// bodyPoolStep, so that a busy node does not allocate, zero and collect one
// per request. A buffer goes back only when nothing can still read it: a
// push's payloads are copied into its log entry before the push succeeds,
// so its handler returns the body after a successful push; every other
// path leaves the body to the collector. The pools are emptied by the
// collector like any sync.Pool.
const (
	bodyPoolMin  = 64 << 10
	bodyPoolMax  = 1 << 20
	bodyPoolStep = 16 << 10
)

var bodyPools [(bodyPoolMax-bodyPoolMin)/bodyPoolStep + 1]sync.Pool

// bodyClass is the pool for a body of n bytes and the capacity of its
// buffers, or -1 when n is outside the pooled sizes.
func bodyClass(n int64) (int, int) {
	if n < bodyPoolMin || n > bodyPoolMax {
		return -1, 0
	}
	c := int((n - bodyPoolMin + bodyPoolStep - 1) / bodyPoolStep)
	return c, bodyPoolMin + c*bodyPoolStep
}

// bodyBuffer returns a buffer of length n, from a pool when n is within
// the pooled sizes (its old bytes are there until the caller overwrites
// them all).
func bodyBuffer(n int64) []byte {
	c, size := bodyClass(n)
	if c < 0 {
		return make([]byte, n)
	}
	if p, ok := bodyPools[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, size)
}

// releaseBody hands a body read by bodyBuffer back for the next request.
// The caller must hold no slice of it, nor have given one to anything that
// may still read it.
func releaseBody(b []byte) {
	c, size := bodyClass(int64(cap(b)))
	if c < 0 || size != cap(b) {
		return
	}
	b = b[:0]
	bodyPools[c].Put(&b)
}
