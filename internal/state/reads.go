package state

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// Reader answers queries from one consistent snapshot of the state.
type Reader struct {
	s    *Store
	snap *pebble.Snapshot
	held bool // holds s.life for reading
	// overlays is the lease index of the snapshot (lease_overlay.go),
	// scanned on the first position read.
	overlays map[cursorRef]*leaseOverlay
}

// Reader opens a snapshot reader; Close it when done. While it is open the
// database cannot be closed or replaced (a snapshot install waits for it).
// A Reader of a closed store reads nothing.
func (s *Store) Reader() *Reader {
	s.waitCommitted()
	s.life.RLock()
	if s.db == nil {
		s.life.RUnlock()
		return &Reader{s: s}
	}
	return &Reader{s: s, snap: s.db.NewSnapshot(), held: true}
}

// Close releases the snapshot.
func (r *Reader) Close() {
	if r.snap != nil {
		r.snap.Close()
		r.snap = nil
	}
	if r.held {
		r.held = false
		r.s.life.RUnlock()
	}
}

func (r *Reader) get(k []byte) []byte {
	if r.snap == nil {
		return nil
	}
	v, closer, err := r.snap.Get(k)
	if err != nil {
		if !errors.Is(err, pebble.ErrNotFound) {
			r.s.log.Error("state read failed", "err", err)
		}
		return nil
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out
}

func (r *Reader) iter(lo, hi []byte) *pebble.Iterator {
	if r.snap == nil {
		return nil
	}
	it, err := r.snap.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		r.s.log.Error("state iterator failed", "err", err)
		return nil
	}
	return it
}

func (r *Reader) tenant(name string) (uint32, bool) {
	v := r.get(tenantKey(name))
	if len(v) != 4 {
		return 0, false
	}
	return uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3]), true
}

func (r *Reader) queue(tid uint32, name string) *queueRec {
	v := r.get(queueNameKey(tid, name))
	if len(v) != 8 {
		return nil
	}
	qv := r.get(queueKey(tid, lastU64(v)))
	if qv == nil {
		return nil
	}
	q := &queueRec{}
	if json.Unmarshal(qv, q) != nil {
		return nil
	}
	return q
}

func (r *Reader) subs(tid uint32, qid uint64) []*subRec {
	p := subQueuePrefix(tid, qid)
	it := r.iter(p, prefixEnd(p))
	if it == nil {
		return nil
	}
	defer it.Close()
	var out []*subRec
	for it.First(); it.Valid(); it.Next() {
		if s, err := decodeSub(it.Value()); err == nil {
			out = append(out, s)
		}
	}
	return out
}

// QueueInfo describes a queue.
type QueueInfo struct {
	Name       string
	Namespace  string
	Task       string
	CreatedAt  int64
	Options    QueueOptions
	Partitions int64
	Total      int64
	Pending    int64 // not yet finished in queue mode
	Pushed     int64
	Deleted    int64
}

func queueInfo(q *queueRec, subs []*subRec) QueueInfo {
	qi := QueueInfo{Name: q.Name, Namespace: q.Namespace, Task: q.Task, CreatedAt: q.CreatedAt, Options: q.Options,
		Partitions: q.Partitions, Total: q.Total, Pushed: q.Pushed, Deleted: q.Deleted}
	for _, s := range subs {
		if s.Group == QueueModeGroup {
			qi.Pending = s.Pending
		}
	}
	return qi
}

// Queues lists a tenant's queues in name order.
func (r *Reader) Queues(tenant string) []QueueInfo {
	tid, ok := r.tenant(tenant)
	if !ok {
		return nil
	}
	p := queueNamePrefix(tid)
	it := r.iter(p, prefixEnd(p))
	if it == nil {
		return nil
	}
	var ids []uint64
	for it.First(); it.Valid(); it.Next() {
		ids = append(ids, lastU64(it.Value()))
	}
	it.Close()
	out := make([]QueueInfo, 0, len(ids))
	for _, id := range ids {
		q := &queueRec{}
		if v := r.get(queueKey(tid, id)); v != nil && json.Unmarshal(v, q) == nil {
			out = append(out, queueInfo(q, r.subs(tid, id)))
		}
	}
	return out
}

// Queue describes one queue.
func (r *Reader) Queue(tenant, name string) (QueueInfo, bool) {
	tid, ok := r.tenant(tenant)
	if !ok {
		return QueueInfo{}, false
	}
	q := r.queue(tid, name)
	if q == nil {
		return QueueInfo{}, false
	}
	return queueInfo(q, r.subs(tid, q.ID)), true
}

// GroupPosition is a group's position in one partition.
type GroupPosition struct {
	Group        string
	Cursor       uint64
	Lag          int64
	LagSeconds   float64
	Leased       bool
	LeaseID      string
	LeaseExpires int64
}

// PartitionInfo describes one partition and each group's position in it.
type PartitionInfo struct {
	ID        uint64
	Name      string
	First     uint64
	Next      uint64
	CreatedAt int64
	LastTime  int64
	Groups    []GroupPosition
}

// position computes a group's position in a partition without writing.
func (r *Reader) position(tid uint32, s *subRec, pid uint64, p *partRec, now int64) GroupPosition {
	gp := GroupPosition{Group: s.Group}
	var c *cursorRec
	if v := r.get(cursorKey(tid, s.ID, pid)); v != nil {
		c, _ = decodeCursor(v)
	}
	if c == nil || c.Epoch != s.Epoch {
		c = &cursorRec{Epoch: s.Epoch}
		switch s.Rule {
		case StartAll:
			c.Cursor = p.First
		case StartIndex:
			c.Cursor = r.firstBy(tid, pid, p, func(_ int64, idx uint64) bool { return idx > s.RuleIndex }, p.LastIdx <= s.RuleIndex)
		case StartTime:
			c.Cursor = r.firstBy(tid, pid, p, func(ct int64, _ uint64) bool { return ct >= s.RuleTime }, p.LastTime < s.RuleTime)
		}
	}
	if ov := r.overlayOf(curRef(tid, s.ID, pid)); ov.appliesTo(s.Epoch, c.Stamp) {
		ov.apply(c)
	}
	if c.Cursor < p.First {
		c.Cursor = p.First
	}
	gp.Cursor = c.Cursor
	lag := int64(p.Next) - int64(c.Cursor)
	for _, x := range c.Ex {
		if x.Off >= c.Cursor && x.Flags&exDone != 0 {
			lag--
		}
		if x.Off < c.Cursor && x.Flags&exRequeued != 0 && x.Flags&exDone == 0 {
			lag++
		}
	}
	gp.Lag = lag
	if c.Cursor < p.Next {
		if ct, _, ok := msgTimeIndex(r.get(msgKey(tid, p.Queue, pid, c.Cursor))); ok && now > ct {
			gp.LagSeconds = float64(now-ct) / 1e6
		}
	}
	if c.LeaseExpires > now {
		gp.Leased = true
		gp.LeaseID = formatUUID(c.LeaseID)
		gp.LeaseExpires = c.LeaseExpires
	}
	return gp
}

// overlayOf returns the overlay of a cursor in the snapshot's lease
// records, scanning them on first use.
func (r *Reader) overlayOf(ref cursorRef) *leaseOverlay {
	if r.overlays == nil {
		r.overlays = map[cursorRef]*leaseOverlay{}
		if it := r.iter([]byte{tLeaseID}, []byte{tLeaseID + 1}); it != nil {
			loadOverlays(it, r.overlays, func(k []byte, err error) {
				r.s.log.Error("state read: damaged lease record", "key", fmt.Sprintf("%x", k), "err", err)
			})
			it.Close()
		}
	}
	return r.overlays[ref]
}

func (r *Reader) firstBy(tid uint32, pid uint64, p *partRec, after func(int64, uint64) bool, none bool) uint64 {
	if none || p.Next == p.First {
		return p.Next
	}
	lo, hi := p.First, p.Next
	for lo < hi {
		mid := lo + (hi-lo)/2
		ct, idx, ok := msgTimeIndex(r.get(msgKey(tid, p.Queue, pid, mid)))
		if !ok || !after(ct, idx) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Partitions lists a queue's partitions in id order, after the given id, at
// most limit of them, with each group's position.
func (r *Reader) Partitions(tenant, queue string, afterID uint64, limit int, now int64) ([]PartitionInfo, bool) {
	tid, ok := r.tenant(tenant)
	if !ok {
		return nil, false
	}
	q := r.queue(tid, queue)
	if q == nil {
		return nil, false
	}
	subs := r.subs(tid, q.ID)
	it := r.iter(partKey(tid, q.ID, afterID+1), prefixEnd(partPrefix(tid, q.ID)))
	if it == nil {
		return nil, true
	}
	defer it.Close()
	var out []PartitionInfo
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		p, err := decodePart(it.Value())
		if err != nil {
			continue
		}
		pid := lastU64(it.Key())
		completeTail(p, tid, pid, r.iter)
		pi := PartitionInfo{ID: pid, Name: p.Name, First: p.First, Next: p.Next, CreatedAt: p.CreatedAt, LastTime: p.LastTime}
		for _, s := range subs {
			pi.Groups = append(pi.Groups, r.position(tid, s, pid, p, now))
		}
		out = append(out, pi)
	}
	return out, true
}

// GroupQueue is a group's subscription to one queue.
type GroupQueue struct {
	Group     string
	Queue     string
	CreatedAt int64
	Rule      string
	Pending   int64
	Consumed  int64
	DLQ       int64
	Skipped   int64
}

// Groups lists every group subscription of a tenant, or only those of group.
func (r *Reader) Groups(tenant, group string) []GroupQueue {
	tid, ok := r.tenant(tenant)
	if !ok {
		return nil
	}
	var out []GroupQueue
	for _, qi := range r.Queues(tenant) {
		q := r.queue(tid, qi.Name)
		if q == nil {
			continue
		}
		for _, s := range r.subs(tid, q.ID) {
			if group != "" && s.Group != group {
				continue
			}
			out = append(out, GroupQueue{Group: s.Group, Queue: q.Name, CreatedAt: s.CreatedAt, Rule: s.Rule,
				Pending: s.Pending, Consumed: s.Consumed, DLQ: s.DLQ, Skipped: s.Skipped})
		}
	}
	return out
}

// GroupPartitions lists a group's position in each partition of a queue,
// paged by partition id.
func (r *Reader) GroupPartitions(tenant, group, queue string, afterID uint64, limit int, now int64) []PartitionInfo {
	parts, _ := r.Partitions(tenant, queue, afterID, limit, now)
	for i := range parts {
		var keep []GroupPosition
		for _, g := range parts[i].Groups {
			if g.Group == group {
				keep = append(keep, g)
			}
		}
		parts[i].Groups = keep
	}
	return parts
}

// DeadLetter is one dead-lettered message.
type DeadLetter struct {
	Queue       string
	Group       string
	PartitionID uint64
	Partition   string
	Offset      uint64
	TxID        string
	Error       string
	Attempts    uint32
	Payload     []byte
	Sealed      bool
	CreatedAt   int64
	FailedAt    int64
}

// DLQ lists dead letters of a queue (and group, and partition name, when
// given), skipping offset entries and returning at most limit, plus the total.
func (r *Reader) DLQ(tenant, queue, group, partition string, limit, offset int) ([]DeadLetter, int, error) {
	tid, ok := r.tenant(tenant)
	if !ok {
		return nil, 0, nil
	}
	var queues []string
	if queue != "" {
		queues = []string{queue}
	} else {
		for _, qi := range r.Queues(tenant) {
			queues = append(queues, qi.Name)
		}
	}
	var out []DeadLetter
	total := 0
	for _, qn := range queues {
		q := r.queue(tid, qn)
		if q == nil {
			continue
		}
		for _, s := range r.subs(tid, q.ID) {
			if group != "" && s.Group != group {
				continue
			}
			p := dlqSubPrefix(tid, s.ID)
			it := r.iter(p, prefixEnd(p))
			if it == nil {
				continue
			}
			for it.First(); it.Valid(); it.Next() {
				var d dlqRec
				if json.Unmarshal(it.Value(), &d) != nil {
					continue
				}
				var pr *partRec
				if v := r.get(partKey(tid, q.ID, d.Partition)); v != nil {
					if pr, _ = decodePart(v); pr != nil {
						completeTail(pr, tid, d.Partition, r.iter)
					}
				}
				if pr == nil || (partition != "" && pr.Name != partition) {
					continue
				}
				total++
				if total <= offset || len(out) >= limit {
					continue
				}
				dl := DeadLetter{Queue: q.Name, Group: s.Group, PartitionID: d.Partition, Partition: pr.Name,
					Offset: d.Offset, Error: d.Error, Attempts: d.Attempts, FailedAt: d.FailedAt}
				if m, err := decodeMsg(r.get(msgKey(tid, q.ID, d.Partition, d.Offset))); err == nil {
					dl.TxID, dl.Payload, dl.Sealed, dl.CreatedAt = m.TxID, m.Payload, m.Sealed, m.CreatedAt
				}
				out = append(out, dl)
			}
			if err := it.Close(); err != nil {
				return nil, 0, fmt.Errorf("list dead letters: %w", err)
			}
		}
	}
	return out, total, nil
}

// Stats summarizes the state for status pages.
type Stats struct {
	Applied  uint64
	Queues   int
	Messages int64
}

// Stats counts queues and messages of a tenant.
func (r *Reader) Stats(tenant string) Stats {
	st := Stats{Applied: r.s.AppliedIndex()}
	for _, q := range r.Queues(tenant) {
		st.Queues++
		st.Messages += q.Total
	}
	return st
}

// Checksum hashes every key and value of the state except the meta record's
// applied index, for determinism and replication checks.
func (s *Store) Checksum() (uint64, error) {
	s.waitCommitted()
	s.life.RLock()
	defer s.life.RUnlock()
	if s.db == nil {
		return 0, errors.New("checksum: store is closed")
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{tMeta + 1}, UpperBound: []byte{tTableLimit}})
	if err != nil {
		return 0, fmt.Errorf("checksum: %w", err)
	}
	defer it.Close()
	h := uint64(14695981039346656037)
	mix := func(b []byte) {
		for _, c := range b {
			h ^= uint64(c)
			h *= 1099511628211
		}
		h ^= uint64(len(b))
		h *= 1099511628211
	}
	for it.First(); it.Valid(); it.Next() {
		mix(it.Key())
		mix(it.Value())
	}
	return h, nil
}

func formatUUID(b [16]byte) string {
	var zero [16]byte
	if b == zero {
		return ""
	}
	return uuid.UUID(b).String()
}

// Tenants lists the tenant names that exist.
func (r *Reader) Tenants() []string {
	it := r.iter([]byte{tTenant}, []byte{tTenant + 1})
	if it == nil {
		return nil
	}
	defer it.Close()
	var out []string
	for it.First(); it.Valid(); it.Next() {
		out = append(out, string(it.Key()[1:]))
	}
	return out
}

// GroupLagSeconds is the age (s) of the oldest message a group has not
// finished: the largest lagSeconds that Partitions reports for the group
// among partitions with lag. It looks at the partitions ready for the group
// and those it has a position in (leased, delayed or read before), at most
// limit of each, so a group with messages in flight is not reported idle.
func (r *Reader) GroupLagSeconds(tenant, queue, group string, now int64, limit int) float64 {
	tid, ok := r.tenant(tenant)
	if !ok {
		return 0
	}
	q := r.queue(tid, queue)
	if q == nil {
		return 0
	}
	var sub *subRec
	for _, s := range r.subs(tid, q.ID) {
		if s.Group == group {
			sub = s
		}
	}
	if sub == nil {
		return 0
	}
	seen := map[uint64]bool{}
	var lag float64
	for _, p := range [][]byte{readySubPrefix(tid, sub.ID), cursorSubPrefix(tid, sub.ID)} {
		it := r.iter(p, prefixEnd(p))
		if it == nil {
			continue
		}
		n := 0
		for ok := it.First(); ok && n < limit; ok = it.Next() {
			n++
			pid := lastU64(it.Key())
			if seen[pid] {
				continue
			}
			seen[pid] = true
			pr, err := decodePart(r.get(partKey(tid, q.ID, pid)))
			if err != nil {
				continue
			}
			completeTail(pr, tid, pid, r.iter)
			if pos := r.position(tid, sub, pid, pr, now); pos.Lag > 0 && pos.LagSeconds > lag {
				lag = pos.LagSeconds
			}
		}
		it.Close()
	}
	return lag
}
