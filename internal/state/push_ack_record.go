package state

import (
	"strings"
	"unsafe"
)

// A push's or an ack's result is kept after its reply so that a retried
// request (the same request id, after an unknown outcome) gets the same
// answer, as a pop's is (pop_record.go). Most of such a result repeats the
// command: a push item's transaction id and queue are the item's own, and
// an ack item's transaction id is the item's unless the apply looked it up
// (the item named its message by offset). PushRecord and AckRecord keep
// only what the apply decided; Result rebuilds the rest from the retried
// command, which is the command the result came from (a retry carries the
// same request id and the same command). A record of a hundred items takes
// a few hundred bytes instead of about ten kilobytes, so the index of kept
// results covers many more requests in the same memory.

// PushRecord is a push's result without what its command holds.
type PushRecord struct {
	Err      *Error
	items    int  // len(Items)
	hasItems bool // Items was not nil
	runs     []pushRun
}

// pushRun is a run of items of one partition at consecutive offsets with
// the same duplicate flag.
type pushRun struct {
	pid, off uint64
	n        uint32
	dup      bool
}

// Record returns the result as a PushRecord. It keeps no memory of r's.
func (r *PushResult) Record() *PushRecord {
	rec := &PushRecord{Err: cloneError(r.Err), items: len(r.Items), hasItems: r.Items != nil}
	n := 0
	for i := range r.Items {
		if i == 0 || !continues(&r.Items[i-1], &r.Items[i]) {
			n++
		}
	}
	rec.runs = make([]pushRun, 0, n)
	for i := range r.Items {
		it := &r.Items[i]
		if i > 0 && continues(&r.Items[i-1], it) {
			rec.runs[len(rec.runs)-1].n++
			continue
		}
		rec.runs = append(rec.runs, pushRun{pid: it.PartitionID, off: it.Offset, n: 1, dup: it.Duplicate})
	}
	return rec
}

// continues reports whether b extends a's run.
func continues(a, b *PushItemResult) bool {
	return a.PartitionID == b.PartitionID && a.Duplicate == b.Duplicate && a.Offset+1 == b.Offset
}

// Result rebuilds the result rec was recorded from, with c the push it
// answered. It reports false when c cannot be that push (another number
// of items).
func (rec *PushRecord) Result(c *Push) (*PushResult, bool) {
	res := &PushResult{Err: rec.Err}
	if !rec.hasItems {
		return res, true
	}
	if c == nil || len(c.Items) != rec.items {
		return nil, false
	}
	res.Items = make([]PushItemResult, 0, rec.items)
	for _, run := range rec.runs {
		for k := uint64(0); k < uint64(run.n); k++ {
			it := &c.Items[len(res.Items)]
			res.Items = append(res.Items, PushItemResult{Duplicate: run.dup, TxID: it.TxID, PartitionID: run.pid, Offset: run.off + k, Queue: it.Queue})
		}
	}
	return res, true
}

// Size estimates the memory the record keeps alive.
func (rec *PushRecord) Size() int {
	return int(unsafe.Sizeof(*rec)) + int(unsafe.Sizeof(pushRun{}))*cap(rec.runs) + errorSize(rec.Err)
}

// AckRecord is an ack's result without what its command holds.
type AckRecord struct {
	Err      *Error
	hasItems bool
	// flags holds, per item, ackOK, ackReleased and ackDLQ.
	flags []byte
	// errs and txids are the items with an error, and the items whose
	// transaction id the apply looked up, in item order.
	errs  []ackRecStr
	txids []ackRecStr
}

type ackRecStr struct {
	i int
	s string
}

const (
	ackOK byte = 1 << iota
	ackReleased
	ackDLQ
)

// Record returns the result as an AckRecord. It keeps no memory of r's.
func (r *AckResult) Record() *AckRecord {
	rec := &AckRecord{Err: cloneError(r.Err), hasItems: r.Items != nil, flags: make([]byte, len(r.Items))}
	for i := range r.Items {
		it := &r.Items[i]
		var f byte
		if it.Success {
			f |= ackOK
		}
		if it.LeaseReleased {
			f |= ackReleased
		}
		if it.DLQ {
			f |= ackDLQ
		}
		rec.flags[i] = f
	}
	rec.errs = keepStrs(r.Items, func(it *AckItemResult) (string, bool) { return it.Error, it.Error != "" })
	rec.txids = keepStrs(r.Items, func(it *AckItemResult) (string, bool) { return it.TxID, it.lookedUp })
	return rec
}

// Result rebuilds the result rec was recorded from, with c the ack it
// answered. It reports false when c cannot be that ack (another number of
// items).
func (rec *AckRecord) Result(c *Ack) (*AckResult, bool) {
	res := &AckResult{Err: rec.Err}
	if !rec.hasItems {
		return res, true
	}
	if c == nil || len(c.Items) != len(rec.flags) {
		return nil, false
	}
	res.Items = make([]AckItemResult, len(rec.flags))
	for i, f := range rec.flags {
		res.Items[i] = AckItemResult{TxID: c.Items[i].TxID, Success: f&ackOK != 0, LeaseReleased: f&ackReleased != 0, DLQ: f&ackDLQ != 0}
	}
	for _, e := range rec.errs {
		res.Items[e.i].Error = e.s
	}
	for _, t := range rec.txids {
		res.Items[t.i].TxID, res.Items[t.i].lookedUp = t.s, true
	}
	return res, true
}

// Size estimates the memory the record keeps alive.
func (rec *AckRecord) Size() int {
	n := int(unsafe.Sizeof(*rec)) + cap(rec.flags) + errorSize(rec.Err) +
		int(unsafe.Sizeof(ackRecStr{}))*(cap(rec.errs)+cap(rec.txids))
	for _, e := range rec.errs {
		n += len(e.s)
	}
	for _, t := range rec.txids {
		n += len(t.s)
	}
	return n
}

// keepStrs returns the strings pick selects from items, with their item
// indexes, copied into one new string: an ack of many messages by offset
// looks up every transaction id, and a copy each was an allocation per
// message.
func keepStrs(items []AckItemResult, pick func(*AckItemResult) (string, bool)) []ackRecStr {
	n, size := 0, 0
	for i := range items {
		if s, ok := pick(&items[i]); ok {
			n, size = n+1, size+len(s)
		}
	}
	if n == 0 {
		return nil
	}
	var b strings.Builder
	b.Grow(size)
	for i := range items {
		if s, ok := pick(&items[i]); ok {
			b.WriteString(s)
		}
	}
	all := b.String()
	out := make([]ackRecStr, 0, n)
	for i := range items {
		if s, ok := pick(&items[i]); ok {
			out = append(out, ackRecStr{i, all[:len(s)]})
			all = all[len(s):]
		}
	}
	return out
}

func cloneError(e *Error) *Error {
	if e == nil {
		return nil
	}
	return &Error{Code: strings.Clone(e.Code), Message: strings.Clone(e.Message)}
}

func errorSize(e *Error) int {
	if e == nil {
		return 0
	}
	return int(unsafe.Sizeof(*e)) + len(e.Code) + len(e.Message)
}
