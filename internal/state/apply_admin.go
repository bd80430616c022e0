package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"sort"
)

// intOptions are the queue options with an effect, all integers.
var intOptions = map[string]func(*QueueOptions) *int64{
	"leaseTime":                 func(o *QueueOptions) *int64 { return &o.LeaseTime },
	"retryLimit":                func(o *QueueOptions) *int64 { return &o.RetryLimit },
	"retryDelay":                func(o *QueueOptions) *int64 { return &o.RetryDelay },
	"delayedProcessing":         func(o *QueueOptions) *int64 { return &o.DelayedProcessing },
	"windowBuffer":              func(o *QueueOptions) *int64 { return &o.WindowBuffer },
	"maxSize":                   func(o *QueueOptions) *int64 { return &o.MaxSize },
	"retentionSeconds":          func(o *QueueOptions) *int64 { return &o.RetentionSeconds },
	"retentionMessages":         func(o *QueueOptions) *int64 { return &o.RetentionMessages },
	"completedRetentionSeconds": func(o *QueueOptions) *int64 { return &o.CompletedRetentionSeconds },
	"maxWaitTimeSeconds":        func(o *QueueOptions) *int64 { return &o.MaxWaitTimeSeconds },
}

// OptionRange is the accepted range of an integer queue option.
type OptionRange struct{ Min, Max int64 }

// IntOptionRanges are the accepted ranges of the integer options.
var IntOptionRanges = map[string]OptionRange{
	"leaseTime":                 {1, 86400},
	"retryLimit":                {0, 1000000},
	"retryDelay":                {0, 86400000},
	"delayedProcessing":         {0, 31536000},
	"windowBuffer":              {0, 86400},
	"maxSize":                   {0, 1 << 50},
	"retentionSeconds":          {0, 1 << 40},
	"retentionMessages":         {0, 1 << 50},
	"completedRetentionSeconds": {0, 1 << 40},
	"maxWaitTimeSeconds":        {0, 1 << 40},
}

// ApplyOptions merges named options into o. It validates everything before
// changing anything and reports the first offending option.
func ApplyOptions(o *QueueOptions, named map[string]json.RawMessage) (field string, err error) {
	// An option stored among the extras before it took effect
	// (maxWaitTimeSeconds) moves to its field unless this call sets it.
	for k, v := range o.Extra {
		if _, ok := intOptions[k]; ok {
			if _, set := named[k]; !set {
				if named == nil {
					named = map[string]json.RawMessage{}
				} else {
					named = maps.Clone(named)
				}
				named[k] = v
			}
		}
	}
	keys := make([]string, 0, len(named))
	for k := range named {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	next := *o
	next.Extra = map[string]json.RawMessage{}
	for k, v := range o.Extra {
		if _, ok := intOptions[k]; !ok {
			next.Extra[k] = v
		}
	}
	for _, k := range keys {
		v := bytes.TrimSpace(named[k])
		if string(v) == "null" {
			continue // null means absent
		}
		if f, ok := intOptions[k]; ok {
			var n json.Number
			d := json.NewDecoder(bytes.NewReader(v))
			d.UseNumber()
			if err := d.Decode(&n); err != nil {
				return k, fmt.Errorf("%s must be an integer", k)
			}
			i, err := n.Int64()
			if err != nil {
				// Accept integral floats such as 30.0.
				fl, ferr := n.Float64()
				if ferr != nil || fl != float64(int64(fl)) {
					return k, fmt.Errorf("%s must be an integer", k)
				}
				i = int64(fl)
			}
			r := IntOptionRanges[k]
			if i < r.Min || i > r.Max {
				return k, fmt.Errorf("%s must be between %d and %d, got %d", k, r.Min, r.Max, i)
			}
			*f(&next) = i
			continue
		}
		if k == "encryptionEnabled" {
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				return k, fmt.Errorf("encryptionEnabled must be true or false")
			}
			next.EncryptionEnabled = b
			continue
		}
		next.Extra[k] = append(json.RawMessage(nil), v...)
	}
	if len(next.Extra) == 0 {
		next.Extra = nil
	}
	*o = next
	return "", nil
}

func (ac *applyCtx) configure(c *Configure) *ConfigureResult {
	tid, _ := ac.tenantID(c.Tenant, true)
	q := ac.queueByName(tid, c.Queue)
	opts := DefaultQueueOptions()
	if q != nil {
		opts = q.Options
	}
	if field, err := ApplyOptions(&opts, c.Options); err != nil {
		return &ConfigureResult{Err: &Error{Code: "invalid_parameter", Message: "options." + field + ": " + err.Error()}}
	}
	if q == nil {
		q = ac.createQueue(tid, c.Queue)
	}
	before := retentionWindow(&q.Options)
	q.Options = opts
	ac.encChanged[ac.tenantNameOf(tid)+"\x00"+q.Name] = opts.EncryptionEnabled
	if after := retentionWindow(&opts); after != 0 && (before == 0 || after < before) {
		// Index what is stored for the new (or shorter) window.
		ac.indexRetention(tid, q)
	}
	if n := opts.RetentionMessages; n > 0 {
		// Apply a new per-partition limit to what is already stored.
		ac.trimQueueByCount(tid, q)
	}
	if c.Namespace != nil {
		q.Namespace = *c.Namespace
	}
	if c.Task != nil {
		q.Task = *c.Task
	}
	ac.markQueue(tid, q)
	return &ConfigureResult{Options: q.Options, Namespace: q.Namespace, Task: q.Task}
}

func (ac *applyCtx) deleteQueue(c *DeleteQueue) *CountResult {
	tid, ok := ac.tenantID(c.Tenant, false)
	if !ok {
		return &CountResult{}
	}
	q := ac.queueByName(tid, c.Queue)
	if q == nil {
		return &CountResult{}
	}
	for _, sk := range ac.subsOf(tid, q.ID) {
		if s := ac.subByKey(sk); s != nil {
			ac.dropSub(tid, q.ID, s)
		}
	}
	// Partition locators are the only per-partition keys; everything else
	// goes by range. A locator's key holds the last id of its run, one of
	// the queue's partitions, so deleting the key of every partition id
	// deletes every run.
	for _, pid := range ac.partitionIDs(tid, q.ID) {
		ac.del(partLocKey(tid, pid))
		delete(ac.partLocs, pid)
	}
	ac.locRuns.dropQueue(tid, q.ID)
	for _, p := range [][]byte{partNamePrefix(tid, q.ID), partPrefix(tid, q.ID), msgQueuePrefix(tid, q.ID), subQueuePrefix(tid, q.ID)} {
		ac.delRange(p)
	}
	ac.del(queueNameKey(tid, q.Name))
	ac.del(queueKey(tid, q.ID))
	ac.encChanged[ac.tenantNameOf(tid)+"\x00"+q.Name] = false
	ac.queueNames[string(queueNameKey(tid, q.Name))] = 0
	delete(ac.queues, string(queueKey(tid, q.ID)))
	delete(ac.dirty, string(queueKey(tid, q.ID)))
	// Cached partition records of the queue must not be written back.
	var gone []uint64
	ac.parts.each(func(pid uint64, p *partRec) {
		if p != nil && p.tid == tid && p.Queue == q.ID {
			gone = append(gone, pid)
		}
	})
	for _, pid := range gone {
		ac.parts.del(pid)
		delete(ac.dirty, string(partKey(tid, q.ID, pid)))
	}
	// Cached name lookups of the queue are confirmed by records no longer
	// cached: they read the names again.
	delete(ac.subLists, string(subQueuePrefix(tid, q.ID)))
	ac.dropFilter(queueRef{tid, q.ID})
	return &CountResult{Found: true, Count: 1}
}

// dropSub removes a subscription and everything of it.
func (ac *applyCtx) dropSub(tid uint32, qid uint64, s *subRec) {
	for _, p := range [][]byte{cursorSubPrefix(tid, s.ID), dlqSubPrefix(tid, s.ID), dlqIndexSubPrefix(tid, s.ID)} {
		ac.delRange(p)
	}
	ac.dropReady(tid, s.ID)
	k := string(subKey(tid, qid, s.Group))
	ac.del([]byte(k))
	ac.subs[k] = nil
	delete(ac.dirty, k)
	for ref := range ac.cursors {
		if ref.tid == uint64(tid) && ref.sub == s.ID {
			delete(ac.cursors, ref)
			delete(ac.dirtyCur, ref)
		}
	}
	for ref := range ac.capCur {
		if ref.tid == uint64(tid) && ref.sub == s.ID {
			delete(ac.capCur, ref)
		}
	}
	ac.settled.dropSub(tid, s.ID)
	delete(ac.subLists, string(subQueuePrefix(tid, qid)))
	ac.forgetLeases()
	// Lease and delayed index entries of the subscription are left to Tick,
	// which drops entries whose subscription no longer exists.
}

// groupSubs lists (queue, subscription) pairs of a group, for one queue or all.
func (ac *applyCtx) groupSubs(tid uint32, group, queue string) []struct {
	q *queueRec
	s *subRec
} {
	if group == "" {
		group = QueueModeGroup
	}
	var out []struct {
		q *queueRec
		s *subRec
	}
	if queue != "" {
		if q := ac.queueByName(tid, queue); q != nil {
			if s := ac.sub(tid, q.ID, group); s != nil {
				out = append(out, struct {
					q *queueRec
					s *subRec
				}{q, s})
			}
		}
		return out
	}
	it := ac.iter(queueNamePrefix(tid))
	var qids []uint64
	if it != nil {
		for it.First(); it.Valid(); it.Next() {
			qids = append(qids, lastU64(it.Value()))
		}
		ac.closeIter(it)
	}
	for _, qid := range qids {
		if q := ac.queue(tid, qid); q != nil {
			if s := ac.sub(tid, q.ID, group); s != nil {
				out = append(out, struct {
					q *queueRec
					s *subRec
				}{q, s})
			}
		}
	}
	return out
}

func (ac *applyCtx) seek(c *Seek) *CountResult {
	tid, ok := ac.tenantID(c.Tenant, false)
	if !ok {
		return &CountResult{}
	}
	res := &CountResult{}
	for _, qs := range ac.groupSubs(tid, c.Group, c.Queue) {
		s := qs.s
		ac.dropReady(tid, s.ID)
		s.Epoch++
		ac.forgetLeases()
		switch {
		case c.ToEnd:
			ac.setRule(tid, qs.q, s, StartIndex, ac.seq(), 0)
		case c.ToStart:
			ac.setRule(tid, qs.q, s, StartAll, 0, 0)
		default:
			ac.setRule(tid, qs.q, s, StartTime, 0, c.Time)
		}
		ac.markSub(tid, qs.q.ID, s)
		ac.wake(tid, qs.q.Name)
		res.Count++
	}
	res.Found = res.Count > 0
	return res
}

func (ac *applyCtx) deleteGroup(c *DeleteGroup) *CountResult {
	tid, ok := ac.tenantID(c.Tenant, false)
	if !ok {
		return &CountResult{}
	}
	res := &CountResult{}
	for _, qs := range ac.groupSubs(tid, c.Group, c.Queue) {
		ac.dropSub(tid, qs.q.ID, qs.s)
		res.Count++
	}
	res.Found = res.Count > 0
	return res
}

func (ac *applyCtx) dlqRequeue(c *DLQRequeue) *CountResult {
	tid, ok := ac.tenantID(c.Tenant, false)
	if !ok {
		return &CountResult{}
	}
	subs := ac.groupSubs(tid, c.Group, c.Queue)
	if len(subs) == 0 {
		return &CountResult{}
	}
	q, s := subs[0].q, subs[0].s
	res := &CountResult{Found: true}
	for _, id := range c.IDs {
		pid, off, err := ParseMessageID(id)
		if err != nil {
			continue
		}
		ik := dlqIndexKey(tid, s.ID, pid, off)
		v := ac.get(ik)
		if len(v) != 8 {
			continue
		}
		p := ac.part(tid, q.ID, pid)
		if p == nil || off < p.First {
			continue
		}
		ac.del(ik)
		ac.del(dlqKey(tid, s.ID, lastU64(v)))
		cur := ac.cursor(tid, s, pid, p)
		x := cur.ex(off)
		x.Flags = 0
		if off < cur.Cursor {
			x.Flags = exRequeued
		}
		x.Attempt, x.Retries, x.VisibleAt = 0, 0, 0
		cur.normalize()
		ac.markCursor(tid, s, pid, cur)
		s.DLQ--
		s.Pending++
		if cur.LeaseExpires == 0 {
			ac.setReady(tid, s, pid, cur)
		}
		res.Count++
	}
	if res.Count > 0 {
		ac.markSub(tid, q.ID, s)
		ac.wake(tid, q.Name)
	}
	return res
}

func (ac *applyCtx) dlqDelete(c *DLQDelete) *CountResult {
	tid, ok := ac.tenantID(c.Tenant, false)
	if !ok {
		return &CountResult{}
	}
	res := &CountResult{}
	for _, qs := range ac.groupSubs(tid, c.Group, c.Queue) {
		ac.delRange(dlqSubPrefix(tid, qs.s.ID))
		ac.delRange(dlqIndexSubPrefix(tid, qs.s.ID))
		res.Count += int(qs.s.DLQ)
		qs.s.DLQ = 0
		ac.markSub(tid, qs.q.ID, qs.s)
	}
	res.Found = true
	return res
}

// trimQueueByCount applies retentionMessages to every partition of a queue.
func (ac *applyCtx) trimQueueByCount(tid uint32, q *queueRec) {
	for _, pid := range ac.partitionIDs(tid, q.ID) {
		if p := ac.part(tid, q.ID, pid); p != nil {
			ac.trimByCount(tid, q, pid, p)
		}
	}
}

// partitionIDs lists a queue's partition ids in id order (a scan of the
// queue's partition records: for admin commands, never the hot path).
func (ac *applyCtx) partitionIDs(tid uint32, qid uint64) []uint64 {
	it := ac.iter(partPrefix(tid, qid))
	if it == nil {
		return nil
	}
	defer ac.closeIter(it)
	var pids []uint64
	for it.First(); it.Valid(); it.Next() {
		pids = append(pids, lastU64(it.Key()))
	}
	return pids
}
