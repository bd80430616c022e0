package pgsource

import (
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/queen-mq/queen/internal/broker"
)

// batch collects encoded messages. Their payloads live in one arena that a
// new batch does not share, so a pushed batch's payloads are never
// overwritten.
type batch struct {
	items []broker.PushItem
	ends  []int
	arena []byte
	idbuf []byte
	bytes int
	// spares holds the buffers of bundles the broker committed, for the
	// next bundles (nil: none are handed back).
	spares chan bundleBufs
}

// bundleBufs are a bundle's item list and payload arena. Once the
// bundle's transaction returned, nothing points into them any more: the
// broker encoded the items into the log entry before proposing it.
type bundleBufs struct {
	items []broker.PushItem
	arena []byte
}

// maxSpareArena bounds the payload arena kept for reuse: a bundle near
// the largest maxBundleBytes is not held on to after it committed.
const maxSpareArena = 8 << 20

func (b *batch) len() int { return len(b.items) }

// add records the message whose payload is arena[start:].
func (b *batch) add(queue, partition string, id []byte, start int) {
	// Fresh: the pointer, not the broker's lookup of ids, keeps a change
	// from being pushed twice (docs/design/source.md, "Message ids and positions").
	b.items = append(b.items, broker.PushItem{Queue: queue, Partition: partition, TxID: string(id), Fresh: true})
	b.ends = append(b.ends, len(b.arena))
	b.bytes += len(b.arena) - start
}

// pushItems returns the items with their payloads, and starts a new arena
// and item list (the broker holds the old ones until the bundle is
// committed): the buffers of a committed bundle when one was handed back
// (giveBack), else new ones sized for a bundle like this one, so that a
// bundle of one small transaction does not pay for the capacity a large
// one grew.
func (b *batch) pushItems() (items []broker.PushItem, arena []byte) {
	start := 0
	for i := range b.items {
		b.items[i].Payload = b.arena[start:b.ends[i]:b.ends[i]]
		start = b.ends[i]
	}
	items, arena = b.items, b.arena
	b.ends, b.bytes = b.ends[:0], 0
	select {
	case sp := <-b.spares:
		b.items, b.arena = sp.items[:0], sp.arena[:0]
		return items, arena
	default:
	}
	b.items = make([]broker.PushItem, 0, grown(len(items), 16))
	b.arena = make([]byte, 0, grown(len(arena), 4<<10))
	return items, arena
}

// giveBack offers a committed bundle's buffers to the bundles after it.
// The item list is cleared first, so that it keeps no names, ids or
// payloads reachable.
func (b *batch) giveBack(items []broker.PushItem, arena []byte) {
	if b.spares == nil || cap(arena) > maxSpareArena {
		return
	}
	clear(items[:cap(items)])
	select {
	case b.spares <- bundleBufs{items: items[:0], arena: arena[:0]}:
	default:
	}
}

// grown is n with a quarter of headroom, at least least.
func grown(n, least int) int { return max(n+n/4, least) }

// txn is what the events of one source transaction share.
type txn struct {
	epoch  string
	commit pglogrepl.LSN
	meta   meta
}

// encodeChange appends the events of one row change: one event, or a d
// and a c when an update moved the row to another partition. For such a
// move whose new row lacks unchanged TOAST columns, it appends nothing and
// returns those columns: the caller reads them back from the table and
// calls again with fill (or with noReadBack when the row is gone).
func (e *encoder) encodeChange(b *batch, rel *relation, c *change, t *txn, seq int, fill *tuple, noReadBack bool) (readBack []int) {
	a := eventArgs{rel: rel, seq: seq}
	switch c.op {
	case 'I':
		a.op, a.keyFrom, a.after = 'c', &c.new, &c.new
		e.emit(b, &a, t, e.partition(rel, &c.new), false)
	case 'D':
		a.op, a.keyFrom, a.before, a.beforeKeyOnly = 'd', &c.old, &c.old, c.oldKind == 'K'
		e.emit(b, &a, t, e.partition(rel, &c.old), false)
	case 'U':
		a.op, a.keyFrom, a.after = 'u', &c.new, &c.new
		if c.oldKind == 'O' {
			// REPLICA IDENTITY FULL: the old row is whole, so it supplies
			// every column the update left unchanged.
			a.fill = &c.old
		}
		newPart := e.partition(rel, &c.new)
		if c.oldKind == 0 {
			e.emit(b, &a, t, newPart, false)
			return nil
		}
		oldPart := e.partition(rel, &c.old)
		if oldPart == newPart {
			if c.oldKind == 'O' {
				a.before = &c.old
			} else if !sameKey(rel, &c.old, &c.new) {
				a.before, a.beforeKeyOnly = &c.old, true
			}
			e.emit(b, &a, t, newPart, false)
			return nil
		}
		// The row moved: d in the old partition, c in the new one. The
		// c must be complete, so missing values are read back first.
		if a.fill == nil && fill == nil && !noReadBack {
			for i := range rel.cols {
				if i < len(c.new.kind) && c.new.kind[i] == colUnchanged {
					readBack = append(readBack, i)
				}
			}
			if len(readBack) > 0 {
				return readBack
			}
		}
		if fill != nil {
			a.fill = fill
		}
		d := eventArgs{op: 'd', rel: rel, keyFrom: &c.old, before: &c.old, beforeKeyOnly: c.oldKind == 'K', seq: seq}
		e.emit(b, &d, t, oldPart, false)
		a.op = 'c'
		e.emit(b, &a, t, newPart, true)
	}
	return nil
}

func (e *encoder) emit(b *batch, a *eventArgs, t *txn, partition string, second bool) {
	start := len(b.arena)
	b.arena = e.appendEvent(b.arena, a, &t.meta)
	b.idbuf = changeID(b.idbuf[:0], t.epoch, t.commit, a.seq, second)
	b.add(a.rel.queue, partition, b.idbuf, start)
}

// encodeTruncate appends a t event (onTruncate "emit", partitionBy
// "single" only).
func (e *encoder) encodeTruncate(b *batch, rel *relation, t *txn, seq int) {
	a := eventArgs{op: 't', rel: rel, seq: seq}
	e.emit(b, &a, t, singlePartition, false)
}

// snapshotRow appends the r event of one row of a chunk whose high
// watermark is position.
func (e *encoder) snapshotRow(b *batch, rel *relation, row *tuple, m *meta, epoch string, position pglogrepl.LSN, seq int) {
	a := eventArgs{op: 'r', rel: rel, keyFrom: row, after: row, seq: seq}
	start := len(b.arena)
	b.arena = e.appendEvent(b.arena, &a, m)
	b.idbuf = strconv.AppendInt(append(b.idbuf[:0], e.snapshotPrefix(epoch, position)...), int64(seq), 10)
	b.add(rel.queue, e.partition(rel, row), b.idbuf, start)
}

// snapshotPrefix is the start of the ids of a chunk's rows,
// "pg:<epoch>:s:<position>:", kept while rows of one chunk follow.
func (e *encoder) snapshotPrefix(epoch string, position pglogrepl.LSN) []byte {
	if e.idEpoch != epoch || e.idPos != position || len(e.idPrefix) == 0 {
		e.idEpoch, e.idPos = epoch, position
		e.idPrefix = snapshotID(e.idPrefix[:0], epoch, position, 0, false)
		e.idPrefix = e.idPrefix[:len(e.idPrefix)-1] // the seq
	}
	return e.idPrefix
}

// fillRow appends a fill event: a u whose after holds the key and cols
// (values from the chunk's row), every other column in unchanged.
func (e *encoder) fillRow(b *batch, rel *relation, row *tuple, cols []int, m *meta, epoch string, position pglogrepl.LSN, seq int) {
	only := append(append([]int(nil), rel.key...), cols...)
	a := eventArgs{op: 'u', rel: rel, keyFrom: row, after: row, onlyCols: only, seq: seq}
	start := len(b.arena)
	b.arena = e.appendEvent(b.arena, &a, m)
	b.idbuf = snapshotID(b.idbuf[:0], epoch, position, seq, true)
	b.add(rel.queue, e.partition(rel, row), b.idbuf, start)
}

// txnMeta builds the shared fields of a transaction's events.
func txnMeta(m *meta, commit pglogrepl.LSN, xid uint32, ts []byte) {
	m.lsn = appendLSN(append(m.lsn[:0], '"'), commit)
	m.lsn = append(m.lsn, '"')
	m.xid = appendUint(m.xid[:0], uint64(xid))
	m.ts = append(m.ts[:0], ts...)
}

func appendUint(buf []byte, v uint64) []byte {
	var tmp [20]byte
	i := len(tmp)
	for v >= 10 {
		i--
		tmp[i] = byte('0' + v%10)
		v /= 10
	}
	i--
	tmp[i] = byte('0' + v)
	return append(buf, tmp[i:]...)
}
