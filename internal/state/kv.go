package state

import (
	"encoding/binary"
	"strings"
)

// InternalKVPrefix is the KV space that belongs to the broker itself.
const InternalKVPrefix = "__queen/"

func kvKey(t uint32, key string) []byte { return newKey(tKV, 4+len(key)).u32(t).str(key) }
func kvExpKey(at int64, t uint32, key string) []byte {
	return newKey(tKVExp, 12+len(key)).i64(at).u32(t).str(key)
}

// kvRec is a stored KV value.
type kvRec struct {
	Version   uint64
	ExpiresAt int64 // µs; 0 = never
	Value     []byte
}

func (r *kvRec) encode() []byte {
	e := enc{b: make([]byte, 0, 18+len(r.Value))}
	e.u8(1)
	e.u64(r.Version)
	e.i64(r.ExpiresAt)
	e.b = append(e.b, r.Value...)
	return e.b
}

func decodeKV(b []byte) (*kvRec, bool) {
	if len(b) < 17 || b[0] != 1 {
		return nil, false
	}
	return &kvRec{Version: binary.BigEndian.Uint64(b[1:9]), ExpiresAt: int64(binary.BigEndian.Uint64(b[9:17])), Value: b[17:]}, true
}

func (r *kvRec) live(now int64) bool { return r.ExpiresAt == 0 || r.ExpiresAt > now }

// IsInternalKey reports whether a KV key belongs to the broker.
func IsInternalKey(key string) bool { return strings.HasPrefix(key, InternalKVPrefix) }

// KVEntry is a KV value as read.
type KVEntry struct {
	Key       string
	Value     []byte
	Version   uint64
	ExpiresAt int64 // µs; 0 = never
}

// KVGet reads a key; expired keys are absent.
func (r *Reader) KVGet(tenant, key string, now int64) (KVEntry, bool) {
	tid, ok := r.tenant(tenant)
	if !ok {
		return KVEntry{}, false
	}
	rec, ok := decodeKV(r.get(kvKey(tid, key)))
	if !ok || !rec.live(now) {
		return KVEntry{}, false
	}
	return KVEntry{Key: key, Value: rec.Value, Version: rec.Version, ExpiresAt: rec.ExpiresAt}, true
}

// KVList lists live keys with a prefix, in key order, after a key.
func (r *Reader) KVList(tenant, prefix, after string, limit int, now int64) []KVEntry {
	tid, ok := r.tenant(tenant)
	if !ok {
		return nil
	}
	lo := kvKey(tid, prefix)
	if after >= prefix {
		lo = append(kvKey(tid, after), 0)
	}
	it := r.iter(lo, prefixEnd(kvKey(tid, prefix)))
	if it == nil {
		return nil
	}
	defer it.Close()
	var out []KVEntry
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		rec, ok := decodeKV(it.Value())
		if !ok || !rec.live(now) {
			continue
		}
		key := string(it.Key()[5:])
		out = append(out, KVEntry{Key: key, Value: append([]byte(nil), rec.Value...), Version: rec.Version, ExpiresAt: rec.ExpiresAt})
	}
	return out
}

// LastTime is the leader-stamped time of the last applied entry (µs).
func (s *Store) LastTime() int64 { return s.lastTime.Load() }
