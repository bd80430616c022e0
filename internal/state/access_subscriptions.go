package state

import (
	"encoding/json"
)

func (t *txn) sub(tid uint32, qid uint64, group string) *subRec {
	k := string(subKey(tid, qid, group))
	if s, ok := t.subs[k]; ok {
		return s
	}
	var s *subRec
	if v := t.get([]byte(k)); v != nil {
		s = &subRec{}
		if err := json.Unmarshal(v, s); err != nil {
			t.corrupt([]byte(k), "subscription", err)
			s = nil
		}
	}
	t.subs[k] = s
	return s
}

func (t *txn) markSub(tid uint32, qid uint64, s *subRec) {
	t.dirty[string(subKey(tid, qid, s.Group))] = s
}

func (t *txn) createSub(tid uint32, q *queueRec, group, rule string, ruleIndex uint64, ruleTime int64) *subRec {
	s := &subRec{ID: t.m.NextSub, Group: group, CreatedAt: t.now, Epoch: 1}
	t.m.NextSub++
	t.setRule(tid, q, s, rule, ruleIndex, ruleTime)
	k := string(subKey(tid, q.ID, group))
	t.subs[k] = s
	t.dirty[k] = s
	// Written through at once so that iterations over the queue's
	// subscriptions within this command see it.
	if b, err := json.Marshal(s); err == nil {
		t.set([]byte(k), b)
	}
	delete(t.subLists, string(subQueuePrefix(tid, q.ID)))
	return s
}

// setRule sets a subscription's start rule and recomputes its pending count.
func (t *txn) setRule(tid uint32, q *queueRec, s *subRec, rule string, ruleIndex uint64, ruleTime int64) {
	s.Rule, s.RuleIndex, s.RuleTime = rule, ruleIndex, ruleTime
	s.Backfill, s.BackfillPos, s.ScanPos = false, 0, 0
	switch rule {
	case StartIndex:
		s.Pending = 0
	case StartAll:
		s.Pending = q.Total
		s.Backfill = q.Partitions > 0
	case StartTime:
		// Exact count: one binary search per partition of the queue.
		var n int64
		it := t.iter(partPrefix(tid, q.ID))
		if it != nil {
			for it.First(); it.Valid(); it.Next() {
				pid := lastU64(it.Key())
				p, ok := t.parts[string(it.Key())]
				if !ok {
					var err error
					if p, err = decodePart(it.Value()); err != nil {
						t.corrupt(it.Key(), "partition", err)
						continue
					}
					completeTail(p, tid, pid, t.iterRange)
				}
				if p == nil {
					continue
				}
				n += int64(p.Next - t.firstAtOrAfter(tid, pid, p, ruleTime))
			}
			t.closeIter(it)
		}
		s.Pending = n
		s.Backfill = q.Partitions > 0
	}
}

// subsOf lists the subscription keys of a queue.
func (t *txn) subsOf(tid uint32, qid uint64) []string {
	pk := string(subQueuePrefix(tid, qid))
	if l, ok := t.subLists[pk]; ok {
		return l
	}
	var l []string
	it := t.iter([]byte(pk))
	if it != nil {
		for it.First(); it.Valid(); it.Next() {
			l = append(l, string(it.Key()))
		}
		t.closeIter(it)
	}
	t.subLists[pk] = l
	return l
}

// subByKey loads a subscription by its full key.
func (t *txn) subByKey(k string) *subRec {
	if s, ok := t.subs[k]; ok {
		return s
	}
	var s *subRec
	if v := t.get([]byte(k)); v != nil {
		s = &subRec{}
		if err := json.Unmarshal(v, s); err != nil {
			t.corrupt([]byte(k), "subscription", err)
			s = nil
		}
	}
	t.subs[k] = s
	return s
}
