package state

import (
	"strings"
	"unsafe"
)

// A pop's result is kept after its reply so that a retried request (the
// same request id, after an unknown outcome) gets the same answer. Kept
// whole it holds every payload the pop handed out; PopRecord holds what
// the log alone decided (the lease, the offsets, the attempt counts) and
// leaves the messages' stored fields in the store, where RestorePop reads
// them back. A message is never changed once written and its key is never
// reused (offsets only grow and ids are never handed out twice), so what
// RestorePop reads is what the pop read, or nothing.

// PopRecord is a pop's result without the messages' stored fields.
type PopRecord struct {
	Err         *Error
	QueueExists bool
	LeaseID     string
	Claimed     int
	Drained     bool
	At          uint64
	tid         uint32
	qid         uint64
	runs        []popRun
}

// popRun is a run of delivered messages of one partition at consecutive
// offsets with the same attempt and retry counts.
type popRun struct {
	pid              uint64
	name             string
	off              uint64
	n                uint32
	attempt, retries uint32
}

// Record returns the result as a PopRecord. It keeps no memory of r's.
func (r *PopResult) Record() *PopRecord {
	rec := &PopRecord{Err: r.Err, QueueExists: r.QueueExists, LeaseID: strings.Clone(r.LeaseID),
		Claimed: r.Claimed, Drained: r.Drained, At: r.At, tid: r.tid, qid: r.qid}
	for i := range r.Messages {
		m := &r.Messages[i]
		if k := len(rec.runs) - 1; k >= 0 {
			run := &rec.runs[k]
			if run.pid == m.PartitionID && run.off+uint64(run.n) == m.Offset && run.attempt == m.Attempt && run.retries == m.Retries {
				run.n++
				continue
			}
		}
		name := m.Partition
		if k := len(rec.runs) - 1; k >= 0 && rec.runs[k].pid == m.PartitionID {
			name = rec.runs[k].name // already cloned
		} else {
			name = strings.Clone(name)
		}
		rec.runs = append(rec.runs, popRun{pid: m.PartitionID, name: name, off: m.Offset, n: 1, attempt: m.Attempt, retries: m.Retries})
	}
	return rec
}

// Messages returns how many messages the pop handed out.
func (rec *PopRecord) Messages() int {
	n := 0
	for _, run := range rec.runs {
		n += int(run.n)
	}
	return n
}

// Size estimates the memory the record keeps alive.
func (rec *PopRecord) Size() int {
	n := int(unsafe.Sizeof(*rec)) + len(rec.LeaseID) + int(unsafe.Sizeof(popRun{}))*cap(rec.runs)
	for i, run := range rec.runs {
		if i == 0 || rec.runs[i-1].name != run.name {
			n += len(run.name)
		}
	}
	if rec.Err != nil {
		n += 64 + len(rec.Err.Code) + len(rec.Err.Message)
	}
	return n
}

// RestorePop rebuilds the result rec was recorded from, reading the
// messages back. It reports false when a message is gone (retention or a
// deletion since the pop): the original answer cannot be given again.
func (r *Reader) RestorePop(rec *PopRecord) (*PopResult, bool) {
	res := &PopResult{Err: rec.Err, QueueExists: rec.QueueExists, LeaseID: rec.LeaseID,
		Claimed: rec.Claimed, Drained: rec.Drained, At: rec.At, tid: rec.tid, qid: rec.qid}
	total := rec.Messages()
	if total == 0 {
		return res, true
	}
	res.Messages = make([]Delivered, 0, total)
	for _, run := range rec.runs {
		for off := run.off; off < run.off+uint64(run.n); off++ {
			v := r.get(msgKey(rec.tid, rec.qid, run.pid, off))
			if v == nil {
				return nil, false
			}
			m, err := decodeMsgView(v) // v is this read's own copy
			if err != nil {
				r.s.log.Error("state read: damaged message", "partition_id", run.pid, "offset", off, "err", err)
				return nil, false
			}
			res.Messages = append(res.Messages, Delivered{
				PartitionID: run.pid, Partition: run.name, Offset: off, TxID: m.TxID, TraceID: m.TraceID,
				CreatedAt: m.CreatedAt, Payload: m.Payload, Sealed: m.Sealed,
				Attempt: run.attempt, Retries: run.retries,
			})
		}
	}
	return res, true
}
