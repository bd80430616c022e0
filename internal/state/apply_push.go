package state

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
)

type partRef struct {
	tid uint32
	pid uint64
}

// pushPlan is the read-only first phase of a push.
type pushPlan struct {
	res         *PushResult
	inRequest   map[[3]string]int
	newPerQueue map[string]int64
	queues      []string
}

// push applies a Push: dedup first (read only), then the maxSize check, then
// the writes. A refusal changes nothing.
func (t *txn) push(c *Push) *PushResult {
	tid, _ := t.tenantID(c.Tenant, true)
	plan, err := t.planPush(tid, c)
	if err != nil {
		return &PushResult{Err: err}
	}
	return t.writePush(tid, c, plan)
}

// planPush looks up what exists, detects duplicates, counts new messages
// per queue and checks maxSize. It changes nothing.
func (t *txn) planPush(tid uint32, c *Push) (*pushPlan, *Error) {
	res := &PushResult{Items: make([]PushItemResult, len(c.Items))}
	inRequest := map[[3]string]int{} // (queue, partition, txid) -> item index
	newPerQueue := map[string]int64{}
	for i := range c.Items {
		it := &c.Items[i]
		r := &res.Items[i]
		r.TxID, r.Queue = it.TxID, it.Queue
		key := [3]string{it.Queue, it.Partition, it.TxID}
		if j, ok := inRequest[key]; ok {
			r.Duplicate = true
			r.Offset = uint64(j) // patched to the first item's offset below
			continue
		}
		inRequest[key] = i
		if !it.Generated || c.Retry {
			if q := t.queueByName(tid, it.Queue); q != nil {
				if pid := t.partIDByName(tid, q.ID, it.Partition); pid != 0 {
					if p := t.part(tid, q.ID, pid); p != nil {
						if off, ok := t.dedupLookup(tid, pid, p, it.TxID); ok {
							r.Duplicate, r.PartitionID, r.Offset = true, pid, off
							inRequest[key] = -1 - i // marks "duplicate of stored"
							continue
						}
					}
				}
			}
		}
		newPerQueue[it.Queue]++
	}
	for i := range c.Items {
		it := &c.Items[i]
		if res.Items[i].Duplicate || it.Sealed {
			continue
		}
		if q := t.queueByName(tid, it.Queue); q != nil && q.Options.EncryptionEnabled {
			return nil, &Error{Code: "encryption_required", Status: 409, Message: fmt.Sprintf(
				"queue %q is encrypted; its payloads must be sealed before they are proposed", it.Queue)}
		}
	}
	queues := make([]string, 0, len(newPerQueue))
	for name := range newPerQueue {
		queues = append(queues, name)
	}
	sort.Strings(queues)
	for _, name := range queues {
		q := t.queueByName(tid, name)
		if q == nil || q.Options.MaxSize <= 0 {
			continue
		}
		if q.Total+newPerQueue[name] > q.Options.MaxSize {
			return nil, &Error{Code: "queue_full", Status: 429, Message: fmt.Sprintf(
				"queue %q holds %d of at most %d messages (maxSize) and this push adds %d; consume or raise maxSize with POST /api/v1/configure",
				name, q.Total, q.Options.MaxSize, newPerQueue[name])}
		}
	}
	return &pushPlan{res: res, inRequest: inRequest, newPerQueue: newPerQueue, queues: queues}, nil
}

// writePush is the second phase of a push: it stores the planned messages.
func (t *txn) writePush(tid uint32, c *Push, plan *pushPlan) *PushResult {
	type pkey struct{ queue, part string }
	res, inRequest, newPerQueue, queues := plan.res, plan.inRequest, plan.newPerQueue, plan.queues
	touched := map[partRef]*queueRec{}
	var order []partRef
	pidCache := map[pkey]uint64{}
	// Message and dedup keys are written in key order (they are distinct
	// keys, so the order changes nothing but speed): a partition's new
	// message keys are consecutive ascending inserts, each followed by the
	// partition's new dedup keys, which sort right after its messages (see
	// dedupKey). Pebble's memtable places such a run without searching its
	// skiplist from the top (it keeps the last insert position).
	type kv struct{ k, v []byte }
	msgs := make([]kv, 0, len(c.Items))
	dedups := make([]kv, 0, len(c.Items))
	for i := range c.Items {
		it := &c.Items[i]
		r := &res.Items[i]
		if r.Duplicate {
			continue
		}
		q := t.queueByName(tid, it.Queue)
		if q == nil {
			q = t.createQueue(tid, it.Queue)
		}
		pk := pkey{it.Queue, it.Partition}
		pid, ok := pidCache[pk]
		var p *partRec
		if ok {
			p = t.part(tid, q.ID, pid)
		} else if pid = t.partIDByName(tid, q.ID, it.Partition); pid != 0 {
			p = t.part(tid, q.ID, pid)
		}
		if p == nil {
			pid, p = t.createPart(tid, q, it.Partition)
		}
		pidCache[pk] = pid
		off := p.Next
		p.Next++
		// Only the tail changes (completeTail), except at the first message.
		tailOnly := p.Gen != 0
		if p.Gen == 0 {
			p.Gen, p.GenStart = 1, off
		}
		p.LastTime, p.LastIdx = t.now, t.seq()
		msgs = append(msgs, kv{msgKey(tid, q.ID, pid, off), encodeMsg(t.now, t.seq(), it.Sealed, it.TxID, it.TraceID, it.Payload)})
		dedups = append(dedups, kv{dedupKey(tid, q.ID, pid, p.Gen, it.TxID), binaryU64(off)})
		if !tailOnly {
			t.markPart(tid, pid, p)
		}
		q.Total++
		q.Pushed++
		t.markQueue(tid, q)
		r.PartitionID, r.Offset = pid, off
		ref := partRef{tid, pid}
		if _, ok := touched[ref]; !ok {
			touched[ref] = q
			order = append(order, ref)
		}
	}
	byKey := func(a, b kv) int { return bytes.Compare(a.k, b.k) }
	msgs = append(msgs, dedups...)
	slices.SortFunc(msgs, byKey)
	for _, w := range msgs {
		t.set(w.k, w.v)
	}
	// Duplicates within the request point at the first item's result.
	for i := range res.Items {
		r := &res.Items[i]
		it := &c.Items[i]
		if !r.Duplicate {
			continue
		}
		j := inRequest[[3]string{it.Queue, it.Partition, it.TxID}]
		if j >= 0 && j != i {
			r.PartitionID, r.Offset = res.Items[j].PartitionID, res.Items[j].Offset
		}
	}

	// Subscriptions: count the new messages and mark partitions ready.
	perQueue := map[uint64]int64{}
	for _, name := range queues {
		if q := t.queueByName(tid, name); q != nil {
			perQueue[q.ID] = newPerQueue[name]
		}
	}
	for _, ref := range order {
		q := touched[ref]
		p := t.part(tid, q.ID, ref.pid)
		for _, sk := range t.subsOf(tid, q.ID) {
			s := t.subByKey(sk)
			if s == nil {
				continue
			}
			if n, ok := perQueue[q.ID]; ok {
				s.Pending += n
				t.markSub(tid, q.ID, s)
			}
			cur := t.cursor(tid, s, ref.pid, p)
			if !cur.leased(t.now) && hasWork(cur, p) {
				t.setReady(tid, s, ref.pid, cur)
			}
		}
		delete(perQueue, q.ID)
		t.noteRetention(tid, q, ref.pid, p)
		t.trimByCount(tid, q, ref.pid, p)
		t.wake(tid, q.Name)
	}
	return res
}

// dedupLookup finds a transaction id among a partition's retained messages.
func (t *txn) dedupLookup(tid uint32, pid uint64, p *partRec, txid string) (uint64, bool) {
	if p.Gen == 0 {
		return 0, false
	}
	for _, g := range []uint32{p.Gen, p.Gen - 1} {
		if g == 0 {
			break
		}
		if v := t.get(dedupKey(tid, p.Queue, pid, g, txid)); len(v) == 8 {
			off := lastU64(v)
			if off >= p.First && off < p.Next {
				return off, true
			}
		}
	}
	return 0, false
}
