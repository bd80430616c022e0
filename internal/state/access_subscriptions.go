package state

func (ac *applyCtx) sub(tid uint32, qid uint64, group string) *subRec {
	return ac.subByKey(string(subKey(tid, qid, group)))
}

func (ac *applyCtx) markSub(tid uint32, qid uint64, s *subRec) {
	ac.dirty[string(subKey(tid, qid, s.Group))] = s
}

func (ac *applyCtx) createSub(tid uint32, q *queueRec, group, rule string, ruleIndex uint64, ruleTime int64) *subRec {
	s := &subRec{ID: ac.m.NextSub, Group: group, CreatedAt: ac.now, Epoch: 1}
	ac.m.NextSub++
	ac.setRule(tid, q, s, rule, ruleIndex, ruleTime)
	k := string(subKey(tid, q.ID, group))
	ac.subs[k] = s
	ac.dirty[k] = s
	// Written through at once so that iterations over the queue's
	// subscriptions within this command see it.
	ac.set([]byte(k), s.appendTo(nil))
	delete(ac.subLists, string(subQueuePrefix(tid, q.ID)))
	// A new subscription id has no ready keys: its ready mirror is
	// complete from the start, empty, and every write of its ready keys
	// keeps it (setReadyAt, delReady, dropReady). Loaded lazily instead,
	// the queue-mode group of a queue that only consumer groups read
	// (nobody pops it, so nothing loads its mirror) had each push read its
	// ready keys one by one, then scan them all (readyMirrorAfter).
	ac.ready[subRef{tid, s.ID}] = newReadySet()
	return s
}

// setRule sets a subscription's start rule and recomputes its pending count.
func (ac *applyCtx) setRule(tid uint32, q *queueRec, s *subRec, rule string, ruleIndex uint64, ruleTime int64) {
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
		it := ac.iter(partPrefix(tid, q.ID))
		if it != nil {
			for it.First(); it.Valid(); it.Next() {
				pid := lastU64(it.Key())
				p, ok := ac.parts.get(pid)
				if !ok {
					var err error
					if p, err = decodePart(it.Value()); err != nil {
						ac.corrupt(it.Key(), "partition", err)
						continue
					}
					completeTail(p, tid, pid, ac.iterRange)
				}
				if p == nil {
					continue
				}
				n += int64(p.Next - ac.firstAtOrAfter(tid, pid, p, ruleTime))
			}
			ac.closeIter(it)
		}
		s.Pending = n
		s.Backfill = q.Partitions > 0
	}
}

// subsOf lists the subscription keys of a queue.
func (ac *applyCtx) subsOf(tid uint32, qid uint64) []string {
	pk := string(subQueuePrefix(tid, qid))
	if l, ok := ac.subLists[pk]; ok {
		return l
	}
	var l []string
	it := ac.iter([]byte(pk))
	if it != nil {
		for it.First(); it.Valid(); it.Next() {
			l = append(l, string(it.Key()))
		}
		ac.closeIter(it)
	}
	ac.subLists[pk] = l
	return l
}

// subByKey loads a subscription by its full key.
func (ac *applyCtx) subByKey(k string) *subRec {
	if s, ok := ac.subs[k]; ok {
		return s
	}
	var s *subRec
	if v := ac.get([]byte(k)); v != nil {
		var err error
		if s, err = decodeSub(v); err != nil {
			ac.corrupt([]byte(k), "subscription", err)
			s = nil
		}
	}
	ac.subs[k] = s
	return s
}
