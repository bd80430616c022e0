package cluster

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/queen-mq/queen/internal/state"
)

// Exactly-once proposals.
//
// A command whose outcome is unknown to the node that submitted it (the
// leader died or lost leadership after receiving it, or the connection to
// the leader dropped after the request was sent) is sent again with the
// same request id. Every raft entry this package writes carries the request
// ids of its commands in a small envelope in front of the state entry, so
// every node sees them in the log. Each node keeps an in-memory index of the
// request ids it applied recently, with their results. A leader that
// receives a retry looks the id up before proposing it again:
//
//   - proposed by itself and still in flight: it waits for that proposal;
//   - applied: it answers with the recorded result (no second proposal);
//     a pop's is recorded without its messages (state.PopRecord), which
//     the answer reads back from the store, and a push's or an ack's
//     without what the command holds (state.PushRecord, state.AckRecord),
//     which the answer takes from the retried command (restoreResult);
//   - absent, and the index covers every entry the original could occupy:
//     the original was never committed and, since this leader has applied
//     every entry of earlier terms (before serving), never will be; it is
//     proposed now;
//   - absent and not covered (this node restarted or restored a snapshot in
//     the meantime): pushes are proposed again marked as retries (the state
//     machine deduplicates them by transaction id); anything else fails with
//     ErrOutcomeUnknown, and the caller decides.
//
// The decision is taken by the leader before proposing, so the log itself
// has no deduplication semantics and Apply stays deterministic on every node.

type reqID [16]byte

func newReqID() reqID {
	var id reqID
	if _, err := rand.Read(id[:]); err != nil {
		// crypto/rand does not fail on supported platforms; fall back to time.
		binary.BigEndian.PutUint64(id[:8], uint64(time.Now().UnixNano()))
	}
	return id
}

// envelopeMagic starts an entry written by this package: magic, a uvarint
// count n, n request ids, then the state entry. A state entry starts with
// its version byte (1), so entries without an envelope still decode.
const envelopeMagic byte = 0xC1

// appendEnvelope appends the envelope of ids (magic, count, ids) to dst;
// the state entry follows it (state.AppendEntry), so the entry is encoded
// in place behind its envelope instead of being copied behind it.
func appendEnvelope(dst []byte, ids []reqID) []byte {
	dst = append(dst, envelopeMagic)
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	for _, id := range ids {
		dst = append(dst, id[:]...)
	}
	return dst
}

// envelopeSize is the length of the envelope of n request ids.
func envelopeSize(n int) int {
	var hdr [binary.MaxVarintLen64]byte
	return 1 + binary.PutUvarint(hdr[:], uint64(n)) + 16*n
}

// encodeProposal encodes en behind the envelope of ids into buf, reused
// from its start when it has the room, else into one new buffer of the
// exact size: the raft entry a proposal hands to raft.
func encodeProposal(buf []byte, ids []reqID, en *state.Entry) ([]byte, error) {
	if cap(buf) < envelopeSize(len(ids)) {
		buf = make([]byte, 0, envelopeSize(len(ids)))
	}
	out, err := state.AppendEntry(appendEnvelope(buf[:0], ids), en)
	if err != nil {
		return nil, fmt.Errorf("encode entry: %w", err)
	}
	return out, nil
}

// unwrapEntry splits an entry into request ids and the state entry. Data
// without a (well-formed) envelope is returned whole.
func unwrapEntry(data []byte) ([]reqID, []byte) {
	if len(data) == 0 || data[0] != envelopeMagic {
		return nil, data
	}
	n, k := binary.Uvarint(data[1:])
	if k <= 0 || n > uint64(len(data))/16 {
		return nil, data
	}
	off := 1 + k
	if uint64(len(data)-off) < 16*n {
		return nil, data
	}
	ids := make([]reqID, n)
	for i := range ids {
		copy(ids[i][:], data[off:off+16])
		off += 16
	}
	return ids, data[off:]
}

// Bounds of the applied-request index (its bytes: Config.DedupBytes,
// DefaultDedupBytes when unset).
const (
	dedupMaxEntries = 100_000
	dedupMaxAge     = 5 * time.Minute
)

// DefaultDedupBytes bounds the memory the results of recently applied
// requests keep alive, when Config.DedupBytes is not set.
const DefaultDedupBytes = 64 << 20

type appliedReq struct {
	id     reqID
	index  uint64
	at     time.Time
	val    any
	hasVal bool // false when the entry was replayed and the store skipped it
	size   int
	next   *appliedReq // the next younger in dedup.order
}

// reqFIFO is the applied requests, oldest first, linked through their
// next field (no list element per request).
type reqFIFO struct {
	head, tail *appliedReq
	n          int
}

func (q *reqFIFO) Len() int { return q.n }

func (q *reqFIFO) pushBack(r *appliedReq) {
	if q.tail == nil {
		q.head = r
	} else {
		q.tail.next = r
	}
	q.tail = r
	q.n++
}

func (q *reqFIFO) popFront() *appliedReq {
	r := q.head
	q.head = r.next
	r.next = nil
	if q.head == nil {
		q.tail = nil
	}
	q.n--
	return r
}

// dedup holds the proposals in flight on this node and the request ids it
// applied recently.
type dedup struct {
	mu      sync.Mutex
	pending map[reqID]*proposal
	applied map[reqID]*appliedReq
	order   reqFIFO
	bytes   int
	// maxBytes bounds bytes: past it the oldest results are dropped
	// (and the covered range starts after them).
	maxBytes int
	// coverFrom: every request id of an entry with index >= coverFrom that
	// this node applied is in applied. 0 = nothing is covered.
	coverFrom uint64
	// resetCover: set after a snapshot restore; the next applied entry
	// starts the covered range.
	resetCover bool
}

func newDedup(coverFrom uint64, maxBytes int) *dedup {
	if maxBytes <= 0 {
		maxBytes = DefaultDedupBytes
	}
	return &dedup{pending: map[reqID]*proposal{}, applied: map[reqID]*appliedReq{}, coverFrom: coverFrom, maxBytes: maxBytes}
}

// record notes the request ids of an applied entry with their results.
// vals is nil when the store skipped the entry (already applied before a
// restart).
func (d *dedup) record(index uint64, ids []reqID, vals []any, skipped bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.resetCover {
		d.resetCover = false
		d.coverFrom = index
	}
	now := time.Now()
	for i, id := range ids {
		if old := d.applied[id]; old != nil {
			// The same id twice in the log (a retry that was proposed when
			// the original could not be found): keep the first result.
			continue
		}
		r := &appliedReq{id: id, index: index, at: now, hasVal: !skipped, size: reqOverhead}
		if !skipped && i < len(vals) {
			r.val = record(vals[i])
			r.size += resultSize(r.val)
		}
		d.order.pushBack(r)
		d.applied[id] = r
		d.bytes += r.size
	}
	d.evict(now)
}

func (d *dedup) evict(now time.Time) {
	for d.order.Len() > 0 {
		front := d.order.head
		if d.order.Len() <= dedupMaxEntries && d.bytes <= d.maxBytes && now.Sub(front.at) <= dedupMaxAge {
			return
		}
		d.order.popFront()
		delete(d.applied, front.id)
		d.bytes -= front.size
		if front.index+1 > d.coverFrom {
			d.coverFrom = front.index + 1
		}
	}
}

// restored forgets everything after a snapshot restore.
func (d *dedup) restored() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.applied = map[reqID]*appliedReq{}
	d.order = reqFIFO{}
	d.bytes = 0
	d.coverFrom = 0
	d.resetCover = true
}

// covers reports whether an entry appended after minIndex would be known.
func (d *dedup) covers(minIndex uint64) bool {
	return d.coverFrom != 0 && d.coverFrom <= minIndex+1
}

// record returns what the index keeps of a result: a pop's, a push's and
// an ack's as records, which leave out what the store (a pop's messages)
// or the retried command (ids, queue names) holds; a retry's answer is
// rebuilt from them (restoreResult).
func record(v any) any {
	switch r := v.(type) {
	case *state.PopResult:
		return r.Record()
	case *state.PushResult:
		return r.Record()
	case *state.AckResult:
		return r.Record()
	}
	return v
}

// reqOverhead is what an applied request costs the index beside its
// result: its appliedReq and its share of the map (key, pointer, bucket
// overhead). Counted so that many small results do not outgrow the budget
// unseen.
const reqOverhead = int(unsafe.Sizeof(appliedReq{})) + 48

// resultSize estimates the memory a result keeps alive.
func resultSize(v any) int {
	switch r := v.(type) {
	case *state.PopRecord:
		return r.Size()
	case *state.PushRecord:
		return r.Size()
	case *state.AckRecord:
		return r.Size()
	case *state.TxnResult:
		n := 64
		for _, op := range r.Results {
			n += 96 + 96*len(op.Push)
		}
		return n
	default:
		return 128
	}
}

// sweep drops results older than dedupMaxAge while no writes arrive
// (evict otherwise runs only when an entry is recorded), so an idle node
// gives their memory back.
func (d *dedup) sweep(stop <-chan struct{}) {
	t := time.NewTicker(dedupMaxAge / 5)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			d.sweepOnce(now)
		}
	}
}

func (d *dedup) sweepOnce(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.evict(now)
	if len(d.applied) == 0 {
		// A map keeps the buckets it grew to; a new one lets them go.
		d.applied = map[reqID]*appliedReq{}
	}
}

// RetryIndex describes the index of applied requests this node keeps to
// answer retries with their first result.
type RetryIndex struct {
	Requests int           // requests whose results are kept
	Bytes    int           // the memory they are counted at (bounded by Config.DedupBytes)
	Window   time.Duration // how long ago the oldest kept request was applied
}

// RetryIndex returns the state of the index of applied requests.
func (n *Node) RetryIndex() RetryIndex {
	d := n.dedup
	d.mu.Lock()
	defer d.mu.Unlock()
	ri := RetryIndex{Requests: d.order.Len(), Bytes: d.bytes}
	if d.order.head != nil {
		ri.Window = time.Since(d.order.head.at)
	}
	return ri
}
