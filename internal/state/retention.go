package state

import "encoding/binary"

// Retention drops whole ranges of a partition's messages with one
// DeleteRange each. A push writes one index key per partition per time
// bucket, ordered by the time the bucket may become deletable; Tick processes
// the keys that are due. The cost is per (partition, bucket), never per
// message, and nothing is created ahead of writers.

// retentionKey: due time, tenant, queue, partition, bucket start.
func retentionKey(due int64, t uint32, q, p uint64, bucket int64) []byte {
	return newKey(tRetention, 36).i64(due).u32(t).u64(q).u64(p).i64(bucket)
}

// retentionWindow is the smallest time-based retention of a queue (µs), or
// 0 when it keeps messages forever (by time).
func retentionWindow(o *QueueOptions) int64 {
	w := int64(0)
	for _, s := range []int64{o.RetentionSeconds, o.CompletedRetentionSeconds, o.MaxWaitTimeSeconds} {
		if s > 0 && (w == 0 || s*1e6 < w) {
			w = s * 1e6
		}
	}
	return w
}

// bucketWidth is the time granularity of the retention index for a window:
// a sixteenth of it, between 1 s and 1 h.
func bucketWidth(window int64) int64 {
	w := window / 16
	if w < 1e6 {
		w = 1e6
	}
	if w > 3600e6 {
		w = 3600e6
	}
	return w
}

// noteRetention indexes a partition's current bucket after a push.
func (ac *applyCtx) noteRetention(tid uint32, q *queueRec, pid uint64, p *partRec) {
	win := retentionWindow(&q.Options)
	if win == 0 {
		return
	}
	w := bucketWidth(win)
	b := ac.now - ac.now%w
	if p.Bucket == b {
		return
	}
	p.Bucket = b
	ac.markPart(tid, pid, p)
	ac.set(retentionKey(b+w+win, tid, q.ID, pid, b), nil)
	ac.schedule(b + w + win)
}

// trimByCount applies retentionMessages after a push.
func (ac *applyCtx) trimByCount(tid uint32, q *queueRec, pid uint64, p *partRec) {
	if n := q.Options.RetentionMessages; n > 0 && p.Next-p.First > uint64(n) {
		ac.trimPartition(tid, q, pid, p, p.Next-uint64(n))
	}
}

// trimPartition deletes the messages of p below cut.
func (ac *applyCtx) trimPartition(tid uint32, q *queueRec, pid uint64, p *partRec, cut uint64) {
	if cut <= p.First {
		return
	}
	if cut > p.Next {
		cut = p.Next
	}
	// Groups that had not finished the dropped messages skip them.
	for _, sk := range ac.subsOf(tid, q.ID) {
		s := ac.subByKey(sk)
		if s == nil {
			continue
		}
		cur := ac.cursor(tid, s, pid, p)
		var lost int64
		if cur.Cursor < cut {
			lost = int64(cut - cur.Cursor)
			for _, x := range cur.Ex {
				if x.Off >= cur.Cursor && x.Off < cut && x.Flags&exDone != 0 {
					lost--
				}
			}
		}
		for _, x := range cur.Ex {
			if x.Off < cur.Cursor && x.Off >= p.First && x.Off < cut && x.Flags&exRequeued != 0 && x.Flags&exDone == 0 {
				lost++
			}
		}
		if lost > 0 {
			s.Pending -= lost
			s.Skipped += lost
			ac.markSub(tid, q.ID, s)
		}
		if cur.Cursor < cut {
			cur.Cursor = cut
		}
		out := cur.Ex[:0]
		for _, x := range cur.Ex {
			if x.Off >= cut {
				out = append(out, x)
			}
		}
		cur.Ex = out
		cur.normalize()
		ac.markCursor(tid, s, pid, cur)
	}
	if err := ac.b.DeleteRange(msgKey(tid, q.ID, pid, p.First), msgKey(tid, q.ID, pid, cut), nil); err != nil {
		ac.s.log.Error("retention range delete failed", "err", err)
		return
	}
	n := int64(cut - p.First)
	p.First = cut
	// Every message of the previous dedup generation is gone: drop its
	// keys by range and start a new generation at the next offset.
	if p.Gen > 0 && cut >= p.GenStart {
		if p.Gen > 1 {
			ac.delRange(dedupGenPrefix(tid, q.ID, pid, p.Gen-1))
		}
		p.Gen++
		p.GenStart = p.Next
	}
	ac.markPart(tid, pid, p)
	q.Total -= n
	q.Deleted += n
	ac.markQueue(tid, q)
}

// expireRetention processes due retention index keys.
func (ac *applyCtx) expireRetention(limit int) int {
	it := ac.iterRange([]byte{tRetention}, newKey(tRetention, 8).i64(ac.now+1))
	if it == nil {
		return 0
	}
	type due struct {
		key    []byte
		tid    uint32
		q, p   uint64
		bucket int64
	}
	var items []due
	for ok := it.First(); ok && len(items) < limit; ok = it.Next() {
		k := it.Key()
		if len(k) != 37 {
			continue
		}
		items = append(items, due{key: append([]byte(nil), k...), tid: binary.BigEndian.Uint32(k[9:13]),
			q: binary.BigEndian.Uint64(k[13:21]), p: binary.BigEndian.Uint64(k[21:29]), bucket: int64(binary.BigEndian.Uint64(k[29:37]))})
	}
	ac.closeIter(it)
	for _, d := range items {
		ac.del(d.key)
		q := ac.queue(d.tid, d.q)
		p := ac.part(d.tid, d.q, d.p)
		if q == nil || p == nil {
			continue
		}
		win := retentionWindow(&q.Options)
		if win == 0 {
			continue // retention was turned off
		}
		o := &q.Options
		cut := p.First
		if o.RetentionSeconds > 0 {
			cut = max(cut, ac.firstAtOrAfter(d.tid, d.p, p, ac.now-o.RetentionSeconds*1e6))
		}
		if o.MaxWaitTimeSeconds > 0 {
			// Queen evicts messages that waited longer than this. Messages
			// leave a partition oldest first, as one range, so finished
			// messages older than this go too.
			cut = max(cut, ac.firstAtOrAfter(d.tid, d.p, p, ac.now-o.MaxWaitTimeSeconds*1e6))
		}
		if o.CompletedRetentionSeconds > 0 {
			c := ac.firstAtOrAfter(d.tid, d.p, p, ac.now-o.CompletedRetentionSeconds*1e6)
			for _, sk := range ac.subsOf(d.tid, d.q) {
				if s := ac.subByKey(sk); s != nil {
					c = min(c, ac.cursor(d.tid, s, d.p, p).Cursor)
				}
			}
			cut = max(cut, c)
		}
		ac.trimPartition(d.tid, q, d.p, p, cut)
		// Messages of this bucket that could not go yet (not consumed, or
		// a longer window since) are looked at again later.
		w := bucketWidth(win)
		if p.First < p.Next {
			if ct, _, ok := msgTimeIndex(ac.get(msgKey(d.tid, d.q, d.p, p.First))); ok && ct < d.bucket+w {
				ac.set(retentionKey(max(ac.now+w, d.bucket+w+win), d.tid, d.q, d.p, d.bucket), nil)
			}
		}
	}
	return len(items)
}

// indexRetention writes a retention key for every partition of a queue whose
// time-based retention was just turned on, so existing messages are covered.
func (ac *applyCtx) indexRetention(tid uint32, q *queueRec) {
	win := retentionWindow(&q.Options)
	if win == 0 {
		return
	}
	w := bucketWidth(win)
	for _, pid := range ac.partitionIDs(tid, q.ID) {
		p := ac.part(tid, q.ID, pid)
		if p == nil || p.First == p.Next {
			continue
		}
		if ct, _, ok := msgTimeIndex(ac.get(msgKey(tid, q.ID, pid, p.First))); ok {
			b := ct - ct%w
			ac.set(retentionKey(b+w+win, tid, q.ID, pid, b), nil)
			ac.schedule(b + w + win)
		}
	}
}
