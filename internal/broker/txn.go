package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/state"
)

// KV limits (docs/http-api.md "KV").
const (
	MaxKeyLen   = 512
	MaxValueLen = 1 << 20
	MaxTTLMs    = 10 * 365 * 24 * 3600 * 1000
	MaxTxnOps   = 10000
)

// Transaction operation types.
const (
	OpPush     = state.OpPush
	OpAck      = state.OpAck
	OpKVPut    = state.OpKVPut
	OpKVDelete = state.OpKVDelete
	OpKVCheck  = state.OpKVCheck
	// OpKVCheckValue: the key must hold exactly Value. In-process callers
	// only (TxnRequest.Internal): a condition on a write still in flight.
	OpKVCheckValue = state.OpKVCheckValue
)

// TxnOp is one operation of a transaction.
type TxnOp struct {
	Type      string
	Items     []PushItem // push
	Ack       AckItem    // ack
	Key       string     // kv.*
	Value     []byte     // kv.put: raw JSON; kv.checkValue: the value required
	IfVersion *uint64    // kv.*: 0 = the key must not exist
	TTLMs     int64      // kv.put
}

// TxnRequest is an all-or-nothing group of operations.
type TxnRequest struct {
	Tenant         string
	RequiredLeases []string
	Ops            []TxnOp
	// Internal allows writes under the broker's own KV space (__queen/);
	// only in-process callers (connectors) set it.
	Internal bool
	// NoPushOutcomes leaves each push operation's outcome (TxnOpOutcome.Push,
	// one per item with its message id) out, for a caller that does not
	// read it.
	NoPushOutcomes bool
}

// TxnOpOutcome reports one operation of a committed transaction.
type TxnOpOutcome struct {
	Type    string
	Push    []PushOutcome
	Ack     AckOutcome
	Key     string
	Version uint64
	Existed bool
}

// Transaction commits every operation or none. A failed condition or a
// refused ack is an *Error with Code "condition_failed" and
// Operation set; nothing changed.
func (b *Broker) Transaction(ctx context.Context, req TxnRequest) ([]TxnOpOutcome, error) {
	cmd, size, err := b.txnCommand(req)
	if err != nil {
		return nil, err
	}
	v, err := b.submit(ctx, cmd, size)
	if err != nil {
		return nil, err
	}
	r, ok := v.(*state.TxnResult)
	if !ok {
		return nil, fmt.Errorf("transaction: unexpected result %T", v)
	}
	if r.Err != nil {
		e := fromState(r.Err)
		if r.FailedOp >= 0 {
			op := r.FailedOp
			e.Operation = &op
		}
		if r.Err.Code == "condition_failed" {
			cv := r.CurrentVersion
			e.CurrentVersion = &cv
		}
		return nil, e
	}
	out := make([]TxnOpOutcome, len(r.Results))
	for i, res := range r.Results {
		o := TxnOpOutcome{Type: req.Ops[i].Type, Ack: res.Ack, Key: res.Key, Version: res.Version, Existed: res.Existed}
		if res.Push != nil {
			if req.NoPushOutcomes {
				b.countPushed(req.Tenant, res.Push)
			} else {
				o.Push = pushOutcomes(&state.PushResult{Items: res.Push})
			}
		}
		out[i] = o
	}
	b.countTxn(cmd, out)
	return out, nil
}

// OnQueued returns a context under which a write (Transaction, Push) calls
// fn once its command is queued for the log on this node, as leader: a
// write this node queues after fn ran comes after it in the log. fn is not
// called when the write goes to another node (this one does not lead), and
// may be called again when the write is proposed again.
func OnQueued(ctx context.Context, fn func()) context.Context { return cluster.OnQueued(ctx, fn) }

// countPushed counts a push's new messages per queue, as countPush does
// from the outcomes.
func (b *Broker) countPushed(tenant string, items []state.PushItemResult) {
	b.countRuns(tenant, len(items), func(i int) (string, bool) { return items[i].Queue, items[i].Duplicate })
}

func (b *Broker) txnCommand(req TxnRequest) (*state.Txn, int, error) {
	if len(req.Ops) == 0 {
		return nil, 0, invalid("operations", "operations must hold at least one operation")
	}
	if len(req.Ops) > MaxTxnOps {
		return nil, 0, invalid("operations", "a transaction holds at most %d operations, got %d", MaxTxnOps, len(req.Ops))
	}
	total := 0
	for _, op := range req.Ops {
		if op.Type == OpPush {
			total += len(op.Items)
		}
	}
	if total > MaxPushItems {
		return nil, 0, TxnTooManyItems(total)
	}
	cmd := &state.Txn{Tenant: req.Tenant, RequiredLeases: req.RequiredLeases, Ops: make([]state.TxnOp, len(req.Ops))}
	size := 64
	for i, op := range req.Ops {
		field := fmt.Sprintf("operations[%d]", i)
		so := state.TxnOp{Type: op.Type, Key: op.Key, Value: op.Value, IfVersion: op.IfVersion, TTLMs: op.TTLMs}
		switch op.Type {
		case OpPush:
			p, n, err := b.pushCommand(req.Tenant, op.Items)
			if err != nil {
				if e, ok := err.(*Error); ok && e.Field != "" {
					e.Field = field + "." + e.Field
				}
				return nil, 0, err
			}
			so.Items = p.Items
			size += n
		case OpAck:
			if op.Ack.Count > 1 {
				return nil, 0, invalid(field+".count", "a transaction acknowledges one message per operation")
			}
			a, err := ackCommand(req.Tenant, []AckItem{op.Ack}, field)
			if err != nil {
				return nil, 0, err
			}
			so.Ack = a.Items[0]
			// A transaction logs its acks whole: the id stays in the command.
			so.Ack.TxID, so.Ack.TxIDKnown = op.Ack.TxID, false
			size += 64
		case OpKVPut, OpKVDelete, OpKVCheck:
			if e := validKey(field+".key", op.Key, req.Internal, op.Type != OpKVCheck); e != nil {
				return nil, 0, e
			}
			if op.Type == OpKVPut {
				if e := validValue(field+".value", op.Value); e != nil {
					return nil, 0, e
				}
				if e := checkRange(field+".ttlMs", op.TTLMs, 0, MaxTTLMs); e != nil {
					return nil, 0, e
				}
			}
			size += len(op.Key) + len(op.Value) + 32
		case OpKVCheckValue:
			if !req.Internal {
				return nil, 0, invalid(field+".type", "type must be push, ack, kv.put, kv.delete or kv.check, got %q", op.Type)
			}
			if e := validKey(field+".key", op.Key, true, false); e != nil {
				return nil, 0, e
			}
			if op.IfVersion != nil || op.TTLMs != 0 {
				return nil, 0, invalid(field, "kv.checkValue takes a key and a value only")
			}
			size += len(op.Key) + len(op.Value) + 32
		default:
			return nil, 0, invalid(field+".type", "type must be push, ack, kv.put, kv.delete or kv.check, got %q", op.Type)
		}
		cmd.Ops[i] = so
	}
	return cmd, size, nil
}

// TxnTooManyItems refuses a transaction whose push operations hold more
// items together than one push may: a transaction costs what a push costs.
func TxnTooManyItems(total int) *Error {
	return invalid("operations", "the push operations of a transaction hold at most %d items together, as one push does; got %d: split it into several transactions", MaxPushItems, total)
}

func validKey(field, key string, internal, write bool) *Error {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return invalid(field, "a key is 1-%d bytes, got %d", MaxKeyLen, len(key))
	}
	if !utf8.ValidString(key) {
		return invalid(field, "a key must be valid UTF-8")
	}
	if write && !internal && state.IsInternalKey(key) {
		return &Error{Code: "reserved_key", Field: field, Message: fmt.Sprintf("keys under %s belong to the broker (connector pointers and leases); clients may read them but not write them", state.InternalKVPrefix)}
	}
	return nil
}

func validValue(field string, v []byte) *Error {
	if len(v) == 0 {
		return invalid(field, "value is required (any JSON value)")
	}
	if len(v) > MaxValueLen {
		return &Error{Code: "payload_too_large", Field: field, Message: fmt.Sprintf("a KV value is at most %d bytes, got %d", MaxValueLen, len(v))}
	}
	if !json.Valid(v) {
		return invalid(field, "value must be JSON")
	}
	return nil
}

// KVPut writes a key. ifVersion (when not nil) must match the current
// version (0: the key must not exist). It returns the new version.
func (b *Broker) KVPut(ctx context.Context, tenant, key string, value []byte, ifVersion *uint64, ttlMs int64, internal bool) (uint64, error) {
	out, err := b.Transaction(ctx, TxnRequest{Tenant: tenant, Internal: internal, Ops: []TxnOp{{Type: OpKVPut, Key: key, Value: value, IfVersion: ifVersion, TTLMs: ttlMs}}})
	if err != nil {
		return 0, stripOp(err)
	}
	return out[0].Version, nil
}

// KVDelete deletes a key; it reports whether a live key was deleted.
func (b *Broker) KVDelete(ctx context.Context, tenant, key string, ifVersion *uint64, internal bool) (bool, error) {
	out, err := b.Transaction(ctx, TxnRequest{Tenant: tenant, Internal: internal, Ops: []TxnOp{{Type: OpKVDelete, Key: key, IfVersion: ifVersion}}})
	if err != nil {
		return false, stripOp(err)
	}
	return out[0].Existed, nil
}

func stripOp(err error) error {
	if e, ok := err.(*Error); ok {
		e.Operation = nil
		e.Field = strings.TrimPrefix(e.Field, "operations[0].")
		e.Message = strings.ReplaceAll(e.Message, "operations[0].", "")
	}
	return err
}

// KVGet reads a key (linearizable). Expired keys are absent.
func (b *Broker) KVGet(ctx context.Context, tenant, key string) (state.KVEntry, bool, error) {
	if e := validKey("key", key, true, false); e != nil {
		return state.KVEntry{}, false, e
	}
	r, err := b.reader(ctx)
	if err != nil {
		return state.KVEntry{}, false, err
	}
	defer r.Close()
	e, ok := r.KVGet(tenant, key, b.readTime())
	return e, ok, nil
}

// KVList lists live keys with a prefix after a key, at most limit.
func (b *Broker) KVList(ctx context.Context, tenant, prefix, after string, limit int) ([]state.KVEntry, error) {
	if limit < 1 || limit > 10000 {
		return nil, invalid("limit", "limit must be between 1 and 10000, got %d", limit)
	}
	r, err := b.reader(ctx)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.KVList(tenant, prefix, after, limit, b.readTime()), nil
}

// readTime is the time reads use to decide expiry: never behind the last
// leader-stamped time this node applied.
func (b *Broker) readTime() int64 {
	now := time.Now().UnixMicro()
	if lt := b.node.Store().LastTime(); lt > now {
		return lt
	}
	return now
}
