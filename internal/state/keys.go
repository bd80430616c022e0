package state

import "encoding/binary"

// Table bytes: the first byte of every key names its table.
const (
	tMeta       byte = 0x01
	tTenant     byte = 0x02
	tQueueName  byte = 0x03
	tQueue      byte = 0x04
	tPartName   byte = 0x05
	tPart       byte = 0x06
	tPartLoc    byte = 0x07
	tMsg        byte = 0x08
	tDedup      byte = 0x09 // unused: dedup keys live in the message table (dedupKey)
	tSub        byte = 0x0A
	tCursor     byte = 0x0B
	tReady      byte = 0x0C
	tLeaseExp   byte = 0x0D
	tLeaseID    byte = 0x0E
	tDelayed    byte = 0x0F
	tDLQ        byte = 0x10
	tDLQIndex   byte = 0x11
	tKV         byte = 0x12
	tKVExp      byte = 0x13
	tRetention  byte = 0x14
	tTableLimit byte = 0x15
)

// kb builds keys with fixed-width big-endian integers.
type kb []byte

func newKey(table byte, capacity int) kb {
	b := make([]byte, 1, 1+capacity)
	b[0] = table
	return b
}

func (k kb) u32(v uint32) kb { return binary.BigEndian.AppendUint32(k, v) }
func (k kb) u64(v uint64) kb { return binary.BigEndian.AppendUint64(k, v) }
func (k kb) i64(v int64) kb  { return binary.BigEndian.AppendUint64(k, uint64(v)) }
func (k kb) str(s string) kb { return append(k, s...) }
func (k kb) raw(b []byte) kb { return append(k, b...) }

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil // p was all 0xff: no upper bound
}

var metaKey = []byte{tMeta}

func tenantKey(name string) []byte { return newKey(tTenant, len(name)).str(name) }

func queueNameKey(t uint32, name string) []byte {
	return newKey(tQueueName, 4+len(name)).u32(t).str(name)
}
func queueNamePrefix(t uint32) []byte { return newKey(tQueueName, 4).u32(t) }
func queueKey(t uint32, q uint64) []byte {
	return newKey(tQueue, 12).u32(t).u64(q)
}
func partNameKey(t uint32, q uint64, name string) []byte {
	return newKey(tPartName, 12+len(name)).u32(t).u64(q).str(name)
}
func partNamePrefix(t uint32, q uint64) []byte { return newKey(tPartName, 12).u32(t).u64(q) }
func partKey(t uint32, q, p uint64) []byte {
	return newKey(tPart, 20).u32(t).u64(q).u64(p)
}
func partPrefix(t uint32, q uint64) []byte { return newKey(tPart, 12).u32(t).u64(q) }
func partLocPrefix(t uint32) []byte        { return newKey(tPartLoc, 4).u32(t) }

// partLocKey is the key of the locator run that ends at partition p.
func partLocKey(t uint32, p uint64) []byte {
	return newKey(tPartLoc, 12).u32(t).u64(p)
}
func msgKey(t uint32, q, p, off uint64) []byte {
	return newKey(tMsg, 28).u32(t).u64(q).u64(p).u64(off)
}

// appendMsgKey appends msgKey(t, q, p, off) to b.
func appendMsgKey(b []byte, t uint32, q, p, off uint64) []byte {
	return kb(append(b, tMsg)).u32(t).u64(q).u64(p).u64(off)
}

// appendU64 appends v as 8 big-endian bytes.
func appendU64(b []byte, v uint64) []byte      { return binary.BigEndian.AppendUint64(b, v) }
func msgQueuePrefix(t uint32, q uint64) []byte { return newKey(tMsg, 12).u32(t).u64(q) }

// dedupMark takes the place of the offset in a dedup key. No message has
// this offset, so a partition's dedup keys sort after all its messages.
const dedupMark = ^uint64(0)

// dedupKey is a partition's dedup key for a transaction id. It lies in the
// message table, right after the partition's messages, with the generation
// and the id's bytes inverted so that newer entries sort first: a push's
// dedup key then lands next to the message key written just before it,
// where Pebble's memtable inserts it without searching its skiplist from
// the top (server-generated ids are UUIDv7s, increasing with time). Point
// reads of messages, offset-bounded iterations and retention's range
// deletes never reach these keys; deleting a queue's messages removes them.
func dedupKey(t uint32, q, p uint64, gen uint32, txid string) []byte {
	return appendDedupKey(make([]byte, 0, 33+len(txid)), t, q, p, gen, txid)
}

// appendDedupKey appends dedupKey(t, q, p, gen, txid) to b.
func appendDedupKey(b []byte, t uint32, q, p uint64, gen uint32, txid string) []byte {
	k := kb(append(b, tMsg)).u32(t).u64(q).u64(p).u64(dedupMark).u32(^gen)
	for i := 0; i < len(txid); i++ {
		k = append(k, ^txid[i])
	}
	return k
}

// isDedupKey tells a dedup key from a message key in the message table.
func isDedupKey(k []byte) bool {
	return len(k) >= 33 && k[0] == tMsg && binary.BigEndian.Uint64(k[21:29]) == dedupMark
}

func dedupGenPrefix(t uint32, q, p uint64, gen uint32) []byte {
	return newKey(tMsg, 32).u32(t).u64(q).u64(p).u64(dedupMark).u32(^gen)
}
func subKey(t uint32, q uint64, group string) []byte {
	return newKey(tSub, 12+len(group)).u32(t).u64(q).str(group)
}
func subQueuePrefix(t uint32, q uint64) []byte { return newKey(tSub, 12).u32(t).u64(q) }
func cursorKey(t uint32, sub, p uint64) []byte {
	return newKey(tCursor, 20).u32(t).u64(sub).u64(p)
}
func cursorSubPrefix(t uint32, sub uint64) []byte { return newKey(tCursor, 12).u32(t).u64(sub) }
func readyKey(t uint32, sub, p uint64) []byte {
	return newKey(tReady, 20).u32(t).u64(sub).u64(p)
}
func readySubPrefix(t uint32, sub uint64) []byte { return newKey(tReady, 12).u32(t).u64(sub) }
func leaseExpKey(at int64, t uint32, sub, p uint64) []byte {
	return newKey(tLeaseExp, 28).i64(at).u32(t).u64(sub).u64(p)
}
func leaseIDKey(t uint32, id [16]byte, sub, p uint64) []byte {
	return newKey(tLeaseID, 36).u32(t).raw(id[:]).u64(sub).u64(p)
}
func leaseIDPrefix(t uint32, id [16]byte) []byte { return newKey(tLeaseID, 20).u32(t).raw(id[:]) }
func delayedKey(at int64, t uint32, sub, p uint64) []byte {
	return newKey(tDelayed, 28).i64(at).u32(t).u64(sub).u64(p)
}
func dlqKey(t uint32, sub, seq uint64) []byte {
	return newKey(tDLQ, 20).u32(t).u64(sub).u64(seq)
}
func dlqSubPrefix(t uint32, sub uint64) []byte { return newKey(tDLQ, 12).u32(t).u64(sub) }
func dlqIndexKey(t uint32, sub, p, off uint64) []byte {
	return newKey(tDLQIndex, 28).u32(t).u64(sub).u64(p).u64(off)
}
func dlqIndexSubPrefix(t uint32, sub uint64) []byte { return newKey(tDLQIndex, 12).u32(t).u64(sub) }

// timeKeyParts decodes the (time, tenant, sub, partition) suffix shared by
// the lease-expiry and delayed indexes.
func timeKeyParts(k []byte) (at int64, t uint32, sub, p uint64, ok bool) {
	if len(k) != 29 {
		return 0, 0, 0, 0, false
	}
	at = int64(binary.BigEndian.Uint64(k[1:9]))
	t = binary.BigEndian.Uint32(k[9:13])
	sub = binary.BigEndian.Uint64(k[13:21])
	p = binary.BigEndian.Uint64(k[21:29])
	return at, t, sub, p, true
}

// lastU64 decodes the final 8 bytes of a key.
func lastU64(k []byte) uint64 {
	if len(k) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(k[len(k)-8:])
}
