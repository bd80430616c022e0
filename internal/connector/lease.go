package connector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// LeaseValue is the JSON value of a lease key.
type LeaseValue struct {
	Node string `json:"node"`
}

// ErrLeaseLost is returned by Renew when another node holds the lease now
// (ours ran out, or it was taken).
var ErrLeaseLost = errors.New("the ownership lease was lost to another node")

// Lease is an ownership lease held in KV: one key with a TTL whose value
// names the holder. Acquire takes it when nobody holds it (or this node
// already does), Renew extends it while it is still ours, Release gives it
// back. Every write is conditional on the version last seen, so two nodes
// never both believe they hold it. Safe for concurrent use.
type Lease struct {
	b      *broker.Broker
	tenant string
	key    string
	node   string
	ttl    time.Duration

	mu      sync.Mutex
	version uint64 // of our lease record; 0 when not held
}

// NewLease is the lease key of tenant, held by node for ttl per write.
func NewLease(b *broker.Broker, tenant, key, node string, ttl time.Duration) *Lease {
	return &Lease{b: b, tenant: tenant, key: key, node: node, ttl: ttl}
}

// TTL is the lease's time to live per write; renew well within it (a
// third of it is a good period).
func (l *Lease) TTL() time.Duration { return l.ttl }

// Version is the KV version of the lease while held (0 when not): a
// transaction that must only commit while this node holds the lease
// carries Check().
func (l *Lease) Version() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.version
}

// Held reports whether this node believes it holds the lease.
func (l *Lease) Held() bool { return l.Version() != 0 }

// Check is a transaction operation that fails unless the lease is still
// the one this node holds (a fence for the writes of an owner).
func (l *Lease) Check() broker.TxnOp {
	v := l.Version()
	return broker.TxnOp{Type: broker.OpKVCheck, Key: l.key, IfVersion: &v}
}

func (l *Lease) value() []byte {
	b, _ := json.Marshal(LeaseValue{Node: l.node})
	return b
}

// Acquire takes the lease if nobody holds it, or renews it if this node
// already does (a restarted node takes back its own lease at once). It
// returns whether this node holds it now and, when not, the holder.
func (l *Lease) Acquire(ctx context.Context) (held bool, holder string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range 3 {
		cur, ok, err := l.b.KVGet(ctx, l.tenant, l.key)
		if err != nil {
			return false, "", fmt.Errorf("read lease %s: %w", l.key, err)
		}
		var ifv uint64
		if ok {
			var v LeaseValue
			_ = json.Unmarshal(cur.Value, &v)
			if v.Node != l.node {
				l.version = 0
				return false, v.Node, nil
			}
			ifv = cur.Version
		}
		nv, err := l.b.KVPut(ctx, l.tenant, l.key, l.value(), &ifv, l.ttl.Milliseconds(), true)
		if isConditionFailed(err) {
			continue
		}
		if err != nil {
			return false, "", fmt.Errorf("take lease %s: %w", l.key, err)
		}
		l.version = nv
		return true, l.node, nil
	}
	return false, "", nil
}

// Renew extends a held lease by its TTL. ErrLeaseLost means another node
// has it now: stop the owner's work at once.
func (l *Lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.version == 0 {
		return ErrLeaseLost
	}
	ifv := l.version
	nv, err := l.b.KVPut(ctx, l.tenant, l.key, l.value(), &ifv, l.ttl.Milliseconds(), true)
	if isConditionFailed(err) {
		l.version = 0
		return ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("renew lease %s: %w", l.key, err)
	}
	l.version = nv
	return nil
}

// Release gives a held lease back at once, so another node takes over
// without waiting for the TTL (a node stopping on SIGTERM). It uses its
// own short deadline: it is called while the work's context is already
// cancelled.
func (l *Lease) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.version == 0 {
		return nil
	}
	ifv := l.version
	l.version = 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := l.b.KVDelete(ctx, l.tenant, l.key, &ifv, true)
	if isConditionFailed(err) {
		return nil // no longer ours: nothing to give back
	}
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.key, err)
	}
	return nil
}

// releaseIfHolder deletes the lease key when node holds it: the runtime's
// safety net after a source stopped, so a stopping node never keeps a
// source for the rest of the TTL.
func releaseIfHolder(ctx context.Context, b *broker.Broker, tenant, key, node string) error {
	cur, ok, err := b.KVGet(ctx, tenant, key)
	if err != nil || !ok {
		return err
	}
	var v LeaseValue
	if json.Unmarshal(cur.Value, &v) != nil || v.Node != node {
		return nil
	}
	ifv := cur.Version
	_, err = b.KVDelete(ctx, tenant, key, &ifv, true)
	if isConditionFailed(err) {
		return nil
	}
	return err
}
