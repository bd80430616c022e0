package state

import (
	"bytes"
	"fmt"
)

// Transaction operation types.
const (
	OpPush     = "push"
	OpAck      = "ack"
	OpKVPut    = "kv.put"
	OpKVDelete = "kv.delete"
	OpKVCheck  = "kv.check"
	// OpKVCheckValue checks that a key holds exactly Value (bytes equal).
	// Unlike a version, a value is known before the write that produces
	// it commits, so a transaction can be conditioned on one still in
	// flight (the PostgreSQL source's pipelined bundles). The broker
	// offers it to in-process callers only.
	OpKVCheckValue = "kv.checkValue"
)

// TxnOp is one operation of a transaction.
type TxnOp struct {
	Type      string
	Items     []PushItem // push
	Ack       AckItem    // ack
	Key       string     // kv.*
	Value     []byte     // kv.put: raw JSON; kv.checkValue: the value required
	IfVersion *uint64    // kv.*: 0 = must not exist
	TTLMs     int64      // kv.put: 0 = no expiry
}

// Txn applies every operation, or none: conditions are checked first, then
// everything is written.
type Txn struct {
	Tenant         string
	Retry          bool
	RequiredLeases []string
	Ops            []TxnOp
}

// TxnOpResult reports one operation.
type TxnOpResult struct {
	Push    []PushItemResult // push
	Ack     AckItemResult    // ack
	Key     string           // kv.*
	Version uint64           // kv.put: the new version; kv.check: the current one
	Existed bool             // kv.delete
}

// TxnResult is the result of a Txn. On failure nothing changed; FailedOp is
// the index of the refused operation (-1 for requiredLeases).
type TxnResult struct {
	Err            *Error
	FailedOp       int
	CurrentVersion uint64 // of the key whose condition failed; 0 = absent
	Results        []TxnOpResult
}

func (c *Txn) kind() byte {
	for i := range c.Ops {
		if c.Ops[i].Type == OpKVCheckValue {
			return kindTxnChecked
		}
	}
	return kindTxn
}

// kvRecord loads a KV record; false when absent. A record that does not
// decode stops the batch.
func (ac *applyCtx) kvRecord(k []byte) (*kvRec, bool) {
	v := ac.get(k)
	if v == nil {
		return nil, false
	}
	rec, ok := decodeKV(v)
	if !ok {
		ac.corrupt(k, "KV", errCorrupt)
	}
	return rec, ok
}

func (ac *applyCtx) kvLoad(tid uint32, key string) *kvRec {
	rec, ok := ac.kvRecord(kvKey(tid, key))
	if !ok || !rec.live(ac.now) {
		return nil
	}
	return rec
}

func condFailed(op int, format string, args ...any) *TxnResult {
	return &TxnResult{FailedOp: op, Err: &Error{Code: "condition_failed", Message: fmt.Sprintf(format, args...)}}
}

func (ac *applyCtx) applyTxn(c *Txn) *TxnResult {
	tid, _ := ac.tenantID(c.Tenant, true)
	// Check phase: nothing below writes state.
	for i, l := range c.RequiredLeases {
		if !ac.leaseHeld(tid, l) {
			r := condFailed(-1, "requiredLeases[%d] %q is no longer held (expired, released or unknown); nothing was changed", i, l)
			return r
		}
	}
	type kvView struct {
		exists  bool
		version uint64
		value   []byte
	}
	overlay := map[string]kvView{}
	view := func(key string) kvView {
		if v, ok := overlay[key]; ok {
			return v
		}
		if rec := ac.kvLoad(tid, key); rec != nil {
			return kvView{true, rec.Version, rec.Value}
		}
		return kvView{}
	}
	var pushAll Push
	pushAll.Tenant, pushAll.Retry = c.Tenant, c.Retry
	acks := make([]ackTarget, len(c.Ops))
	for i := range c.Ops {
		op := &c.Ops[i]
		switch op.Type {
		case OpPush:
			if pushAll.Items == nil {
				// One push op (the usual case) is not copied; the capacity
				// is clipped so that a second one is.
				pushAll.Items = op.Items[:len(op.Items):len(op.Items)]
			} else {
				pushAll.Items = append(pushAll.Items, op.Items...)
			}
		case OpAck:
			tg, code := ac.ackResolve(tid, &op.Ack)
			if code != "" {
				return condFailed(i, "operation %d (ack of partition %d) was refused: %s; nothing was changed", i, op.Ack.PartitionID, code)
			}
			acks[i] = tg
		case OpKVCheckValue:
			if v := view(op.Key); !v.exists || !bytes.Equal(v.value, op.Value) {
				r := condFailed(i, "operation %d (kv.checkValue %q): the key does not hold the value required (current version %d, 0 = absent); nothing was changed", i, op.Key, v.version)
				r.CurrentVersion = v.version
				return r
			}
		case OpKVPut, OpKVDelete, OpKVCheck:
			v := view(op.Key)
			if op.IfVersion != nil {
				want := *op.IfVersion
				if (want == 0 && v.exists) || (want != 0 && (!v.exists || v.version != want)) {
					r := condFailed(i, "operation %d (%s %q): ifVersion %d does not match the current version %d (0 = absent); nothing was changed", i, op.Type, op.Key, want, v.version)
					r.CurrentVersion = v.version
					return r
				}
			} else if op.Type == OpKVCheck && !v.exists {
				return condFailed(i, "operation %d (kv.check %q): the key does not exist; nothing was changed", i, op.Key)
			}
			switch op.Type {
			case OpKVPut:
				overlay[op.Key] = kvView{true, ac.seq(), op.Value}
			case OpKVDelete:
				overlay[op.Key] = kvView{}
			}
		default:
			return &TxnResult{FailedOp: i, Err: &Error{Code: "invalid_parameter", Message: fmt.Sprintf("operation %d: unknown type %q", i, op.Type)}}
		}
	}
	var plan *pushPlan
	if len(pushAll.Items) > 0 {
		var err *Error
		if plan, err = ac.planPush(tid, &pushAll); err != nil {
			return &TxnResult{FailedOp: ac.firstPushOp(c), Err: err}
		}
	}
	// Apply phase.
	res := &TxnResult{FailedOp: -1, Results: make([]TxnOpResult, len(c.Ops))}
	var pushRes *PushResult
	if plan != nil {
		pushRes = ac.writePush(tid, &pushAll, plan)
	}
	pi := 0
	for i := range c.Ops {
		op := &c.Ops[i]
		r := &res.Results[i]
		switch op.Type {
		case OpPush:
			r.Push = pushRes.Items[pi : pi+len(op.Items)]
			pi += len(op.Items)
		case OpAck:
			// Re-resolve: an earlier operation may have changed the cursor.
			tg, code := ac.ackResolve(tid, &op.Ack)
			if code == "" {
				ac.ackApply(tid, tg, &op.Ack, &r.Ack)
			} else {
				r.Ack.Error = code
			}
			r.Ack.TxID = tg.txid
		case OpKVPut:
			r.Key, r.Version = op.Key, ac.kvPut(tid, op.Key, op.Value, op.TTLMs)
		case OpKVDelete:
			r.Key, r.Existed = op.Key, ac.kvDelete(tid, op.Key)
		case OpKVCheck, OpKVCheckValue:
			r.Key, r.Version = op.Key, view(op.Key).version
		}
	}
	return res
}

func (ac *applyCtx) firstPushOp(c *Txn) int {
	for i, op := range c.Ops {
		if op.Type == OpPush {
			return i
		}
	}
	return -1
}

func (ac *applyCtx) kvPut(tid uint32, key string, value []byte, ttlMs int64) uint64 {
	k := kvKey(tid, key)
	if old, ok := ac.kvRecord(k); ok && old.ExpiresAt != 0 {
		ac.del(kvExpKey(old.ExpiresAt, tid, key))
	}
	rec := kvRec{Version: ac.seq(), Value: value}
	if ttlMs > 0 {
		rec.ExpiresAt = ac.now + ttlMs*1000
		ac.set(kvExpKey(rec.ExpiresAt, tid, key), nil)
		ac.schedule(rec.ExpiresAt)
	}
	ac.set(k, rec.encode())
	return rec.Version
}

func (ac *applyCtx) kvDelete(tid uint32, key string) bool {
	k := kvKey(tid, key)
	old, ok := ac.kvRecord(k)
	if !ok {
		return false
	}
	if old.ExpiresAt != 0 {
		ac.del(kvExpKey(old.ExpiresAt, tid, key))
	}
	ac.del(k)
	return old.live(ac.now)
}

// leaseHeld reports whether any partition is still leased under id.
func (ac *applyCtx) leaseHeld(tid uint32, l string) bool {
	id, ok := parseLeaseID(l)
	if !ok {
		return false
	}
	holds := ac.leaseHolds(tid, id)
	for _, h := range holds {
		qid := ac.partQueue(tid, h.pid)
		p := ac.part(tid, qid, h.pid)
		s := ac.subByID(tid, qid, h.sub)
		if p == nil || s == nil {
			continue
		}
		if cur := ac.cursor(tid, s, h.pid, p); cur.LeaseID == id && cur.leased(ac.now) {
			return true
		}
	}
	return false
}

// expireKV removes KV keys whose TTL passed (called by Tick).
func (ac *applyCtx) expireKV(limit int) int {
	it := ac.iterRange([]byte{tKVExp}, newKey(tKVExp, 8).i64(ac.now+1))
	if it == nil {
		return 0
	}
	type due struct {
		at  int64
		tid uint32
		key string
	}
	var items []due
	for ok := it.First(); ok && len(items) < limit; ok = it.Next() {
		k := it.Key()
		if len(k) < 13 {
			continue
		}
		items = append(items, due{int64(lastU64(k[:9])), uint32(k[9])<<24 | uint32(k[10])<<16 | uint32(k[11])<<8 | uint32(k[12]), string(k[13:])})
	}
	ac.closeIter(it)
	for _, d := range items {
		ac.del(kvExpKey(d.at, d.tid, d.key))
		if rec, ok := ac.kvRecord(kvKey(d.tid, d.key)); ok && rec.ExpiresAt == d.at {
			ac.del(kvKey(d.tid, d.key))
		}
	}
	return len(items)
}

func encodeTxn(c *Txn) []byte { return appendTxn(make([]byte, 0, txnSize(c)), c) }

// txnSize is the exact length of c's encoding.
func txnSize(c *Txn) int {
	size := strSize(len(c.Tenant)) + 1 + uvSize(uint64(len(c.RequiredLeases)))
	for _, l := range c.RequiredLeases {
		size += strSize(len(l))
	}
	size += uvSize(uint64(len(c.Ops)))
	for i := range c.Ops {
		op := &c.Ops[i]
		size += strSize(len(op.Type))
		switch op.Type {
		case OpPush:
			size += strSize(pushSize(&Push{Items: op.Items}))
		case OpAck:
			a := &op.Ack
			size += 8 + strSize(len(a.TxID)) + 1 + strSize(len(a.Status)) + strSize(len(a.Group)) + strSize(len(a.LeaseID)) + strSize(len(a.Error))
			if a.Offset != nil {
				size += 8
			}
		default:
			size += strSize(len(op.Key)) + strSize(len(op.Value)) + 1 + 8
			if op.IfVersion != nil {
				size += 8
			}
		}
	}
	return size
}

// appendTxn appends c's encoding to b.
func appendTxn(b []byte, c *Txn) []byte {
	e := enc{b: b}
	e.str(c.Tenant)
	e.bool(c.Retry)
	e.uv(uint64(len(c.RequiredLeases)))
	for _, l := range c.RequiredLeases {
		e.str(l)
	}
	e.uv(uint64(len(c.Ops)))
	for i := range c.Ops {
		op := &c.Ops[i]
		e.str(op.Type)
		switch op.Type {
		case OpPush:
			p := Push{Items: op.Items}
			e.uv(uint64(pushSize(&p)))
			e.b = appendPush(e.b, &p)
		case OpAck:
			encodeAckItem(&e, &op.Ack)
		default:
			e.str(op.Key)
			e.bytes(op.Value)
			e.bool(op.IfVersion != nil)
			if op.IfVersion != nil {
				e.u64(*op.IfVersion)
			}
			e.i64(op.TTLMs)
		}
	}
	return e.b
}

func decodeTxn(b []byte) (*Txn, error) {
	d := dec{b: b}
	c := &Txn{Tenant: d.str(), Retry: d.bool()}
	n := d.uv()
	if d.err != nil || n > uint64(len(b)) {
		return nil, errCorrupt
	}
	for i := uint64(0); i < n; i++ {
		c.RequiredLeases = append(c.RequiredLeases, d.str())
	}
	n = d.uv()
	if d.err != nil || n > uint64(len(b)) {
		return nil, errCorrupt
	}
	c.Ops = make([]TxnOp, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		op := TxnOp{Type: d.str()}
		switch op.Type {
		case OpPush:
			p, err := decodePush(d.bytes())
			if err != nil {
				return nil, err
			}
			op.Items = p.Items
		case OpAck:
			decodeAckItem(&d, &op.Ack, d.str, new(uint64))
		default:
			op.Key = d.str()
			op.Value = d.bytes()
			if d.bool() {
				v := d.u64()
				op.IfVersion = &v
			}
			op.TTLMs = d.i64()
		}
		c.Ops = append(c.Ops, op)
	}
	return c, d.err
}
