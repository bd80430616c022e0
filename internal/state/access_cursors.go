package state

// cursor loads (or computes from the start rule) a group's cursor in a
// partition. The result is cached but not marked dirty.
func (t *txn) cursor(tid uint32, s *subRec, pid uint64, p *partRec) *cursorRec {
	c, _ := t.cursorAt(tid, s, pid, p)
	return c
}

// cursorAt is cursor, and also returns the cursor's key.
func (t *txn) cursorAt(tid uint32, s *subRec, pid uint64, p *partRec) (*cursorRec, string) {
	t.keyBuf = kb(append(t.keyBuf[:0], tCursor)).u32(tid).u64(s.ID).u64(pid)
	c, ok := t.cursors[string(t.keyBuf)]
	k := ""
	// A partition created in this batch has no stored cursor: its id is
	// new, and cursors reach the batch only when it is flushed.
	if !ok && p.born != t.serial {
		k = string(t.keyBuf)
		if v := t.get(t.keyBuf); v != nil {
			var err error
			if c, err = decodeCursor(v); err != nil {
				t.corrupt([]byte(k), "cursor", err)
				c = nil
			}
		}
		t.cursors[k] = c
	}
	if k == "" && (c == nil || c.Epoch != s.Epoch || c.Cursor < p.First) {
		k = string(t.keyBuf)
	}
	if c == nil || c.Epoch != s.Epoch {
		c = &cursorRec{Epoch: s.Epoch}
		switch s.Rule {
		case StartAll:
			c.Cursor = p.First
		case StartIndex:
			c.Cursor = t.firstAfterIndex(tid, pid, p, s.RuleIndex)
		case StartTime:
			c.Cursor = t.firstAtOrAfter(tid, pid, p, s.RuleTime)
		}
		t.cursors[k] = c
		t.dirty[k] = c
	}
	if c.Cursor < p.First {
		c.Cursor = p.First
		c.normalize()
		t.dirty[k] = c
	}
	return c, k
}

// setReady puts (group, partition) in the ready index unless it is there.
func (t *txn) setReady(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	if !c.Ready {
		t.setReadyAt(tid, s, pid, c, string(cursorKey(tid, s.ID, pid)))
	}
}

// setReadyAt is setReady for a cursor whose key (ck) the caller may have
// ("": not yet).
func (t *txn) setReadyAt(tid uint32, s *subRec, pid uint64, c *cursorRec, ck string) {
	if c.Ready {
		return
	}
	if ck == "" {
		ck = string(cursorKey(tid, s.ID, pid))
	}
	t.scratch = kb(append(t.scratch[:0], tReady)).u32(tid).u64(s.ID).u64(pid)
	t.set(t.scratch, nil)
	if r := t.ready[subRef{tid, s.ID}]; r != nil {
		r.ReplaceOrInsert(pid)
	}
	c.Ready = true
	t.dirty[ck] = c
}

// clearReady takes (group, partition) out of the ready index.
func (t *txn) clearReady(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	if !c.Ready {
		return
	}
	t.delReady(tid, s.ID, pid)
	c.Ready = false
	t.markCursor(tid, s, pid, c)
}

// delReady deletes one ready key and its mirror entry.
func (t *txn) delReady(tid uint32, sub, pid uint64) {
	t.del(readyKey(tid, sub, pid))
	if r := t.ready[subRef{tid, sub}]; r != nil {
		r.Delete(pid)
	}
}

// dropReady deletes a subscription's whole ready index.
func (t *txn) dropReady(tid uint32, sub uint64) {
	t.delRange(readySubPrefix(tid, sub))
	delete(t.ready, subRef{tid, sub})
}

// readyOf returns the in-memory mirror of a subscription's ready index,
// loading it from the batch (which sees this batch's writes) on first use.
func (t *txn) readyOf(tid uint32, sub uint64) *readySet {
	k := subRef{tid, sub}
	if r := t.ready[k]; r != nil {
		return r
	}
	r := newReadySet()
	if it := t.iter(readySubPrefix(tid, sub)); it != nil {
		for ok := it.First(); ok; ok = it.Next() {
			r.ReplaceOrInsert(lastU64(it.Key()))
		}
		t.closeIter(it)
	}
	t.ready[k] = r
	return r
}

func (t *txn) markCursor(tid uint32, s *subRec, pid uint64, c *cursorRec) {
	t.dirty[string(cursorKey(tid, s.ID, pid))] = c
}

// hasWork reports whether the group has deliverable-in-principle messages in
// the partition (ignoring leases and visibility times).
func hasWork(c *cursorRec, p *partRec) bool {
	if c.Cursor < p.Next {
		return true
	}
	for _, x := range c.Ex {
		if x.Flags&exRequeued != 0 && x.Flags&exDone == 0 {
			return true
		}
	}
	return false
}
