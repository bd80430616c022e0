package connector

import (
	"context"
	"log/slog"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

// Runner is one connector's work on this node, built by a Factory from a
// document. Run works until ctx is cancelled (the document changed or was
// deleted, or the node stops) and returns nil then; any other return is an
// error the runtime reports and retries after a backoff. Run reports its
// phase through Env.Status as it goes.
type Runner interface {
	Run(ctx context.Context) error
}

// Factory builds the Runner of one document. It must not block or connect:
// Run does that.
type Factory func(env Env) (Runner, error)

// Env is what the runtime hands a connector.
type Env struct {
	Broker *broker.Broker
	Tenant string
	// Doc is the stored document; Password is its unsealed password ("" for none).
	Doc      Document
	Password string
	// NodeID names this node (for ownership leases).
	NodeID string
	// LeaseTTL is QUEEN_PG_LEASE_TTL_MS: how long a source's ownership
	// lease lasts per renewal (NewLease uses it).
	LeaseTTL time.Duration
	// AllowPrivateNetworks is QUEEN_PG_ALLOW_PRIVATE_NETWORKS: when false,
	// Connect refuses loopback, private and link-local hosts (code egress).
	AllowPrivateNetworks bool
	// Status is this node's status of the connector.
	Status *StatusReporter
	// Metrics are the connector metrics, already labelled with this
	// connector and tenant.
	Metrics *ConnectorMetrics
	// CPU bounds the connector goroutines doing CPU work at once
	// (QUEEN_PG_THREADS): Acquire before decoding or encoding a batch,
	// Release after.
	CPU *Pool
	Log *slog.Logger
	// Remove deletes the document for good (a source's owner calls it once
	// it dropped what a DELETE asked it to drop).
	Remove func(ctx context.Context) error
}

// NewLease is the source's ownership lease (LeaseKey of the document's
// name, in its tenant), held by this node for LeaseTTL per renewal.
func (e Env) NewLease() *Lease {
	return NewLease(e.Broker, e.Tenant, LeaseKey(e.Doc.Name), e.NodeID, e.LeaseTTL)
}

// Pool is a counting semaphore shared by every connector of a node.
type Pool struct{ ch chan struct{} }

// NewPool makes a pool of n slots (n >= 1).
func NewPool(n int) *Pool {
	if n < 1 {
		n = 1
	}
	return &Pool{ch: make(chan struct{}, n)}
}

// Acquire takes a slot, or returns ctx's error.
func (p *Pool) Acquire(ctx context.Context) error {
	select {
	case p.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release gives a slot back.
func (p *Pool) Release() { <-p.ch }
