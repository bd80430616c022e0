package pgsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// errLeaseLost: another node holds the source's lease now.
var errLeaseLost = errors.New("the source's ownership lease was lost to another node")

// lease is the source's ownership lease: one KV key with a TTL naming the
// node that runs the source; every write is conditional on the version
// last seen.
type lease struct {
	b      *broker.Broker
	tenant string
	key    string
	node   string
	ttl    time.Duration

	mu      sync.Mutex
	version uint64
}

type leaseValue struct {
	Node string `json:"node"`
}

func newLease(b *broker.Broker, tenant, key, node string, ttl time.Duration) *lease {
	return &lease{b: b, tenant: tenant, key: key, node: node, ttl: ttl}
}

func (l *lease) value() []byte {
	v, _ := json.Marshal(leaseValue{Node: l.node})
	return v
}

func isConditionFailed(err error) bool {
	var be *broker.Error
	return errors.As(err, &be) && be.Code == "condition_failed"
}

// acquire takes the lease when nobody holds it or this node does.
func (l *lease) acquire(ctx context.Context) (bool, string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range 3 {
		cur, ok, err := l.b.KVGet(ctx, l.tenant, l.key)
		if err != nil {
			return false, "", fmt.Errorf("read the source's lease: %w", err)
		}
		var ifv uint64
		if ok {
			var v leaseValue
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
			return false, "", fmt.Errorf("take the source's lease: %w", err)
		}
		l.version = nv
		return true, l.node, nil
	}
	return false, "", nil
}

// renew extends a held lease; errLeaseLost when it is no longer ours.
func (l *lease) renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.version == 0 {
		return errLeaseLost
	}
	ifv := l.version
	nv, err := l.b.KVPut(ctx, l.tenant, l.key, l.value(), &ifv, l.ttl.Milliseconds(), true)
	if isConditionFailed(err) {
		l.version = 0
		return errLeaseLost
	}
	if err != nil {
		return fmt.Errorf("renew the source's lease: %w", err)
	}
	l.version = nv
	return nil
}

// release gives the lease back at once (a stopping node).
func (l *lease) release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.version == 0 {
		return nil
	}
	ifv := l.version
	l.version = 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.b.KVDelete(ctx, l.tenant, l.key, &ifv, true); err != nil && !isConditionFailed(err) {
		return fmt.Errorf("give back the source's lease: %w", err)
	}
	return nil
}
