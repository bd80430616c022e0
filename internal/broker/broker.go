package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/seal"
	"github.com/queen-mq/queen/internal/state"
)

// Config configures a broker.
type Config struct {
	Cluster cluster.Config
	// DefaultSubscriptionMode is "new" (default) or "all": where a new named
	// group starts when the pop does not say.
	DefaultSubscriptionMode string
	// EncryptionKey (64 hex characters) seals payloads of queues with
	// encryptionEnabled. Without it such queues are refused.
	EncryptionKey string
	Logger        *slog.Logger
}

// Broker is the broker's Go API.
type Broker struct {
	cfg       Config
	log       *slog.Logger
	node      *cluster.Node
	sealer    *seal.Sealer
	m         *metrics
	waiters   *waiters
	closing   chan struct{}
	drainOnce sync.Once
	wg        sync.WaitGroup
}

// Open starts the node and the broker on it.
func Open(cfg Config) (*Broker, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch cfg.DefaultSubscriptionMode {
	case "", "new", "new-only":
		cfg.DefaultSubscriptionMode = "new"
	case "all":
	default:
		return nil, fmt.Errorf("default subscription mode %q: want new or all", cfg.DefaultSubscriptionMode)
	}
	sealer, err := seal.New(cfg.EncryptionKey)
	if err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, log: cfg.Logger, sealer: sealer, m: newMetrics(), waiters: newWaiters(), closing: make(chan struct{})}
	cfg.Cluster.Logger = cfg.Logger
	cfg.Cluster.OnWake = b.waiters.wake
	node, err := cluster.Open(cfg.Cluster)
	if err != nil {
		return nil, err
	}
	b.node = node
	if n := node.Store().EncryptedQueues(); n > 0 && sealer == nil {
		b.log.Error("this node holds encrypted queues but has no QUEEN_ENCRYPTION_KEY: it will refuse to serve their messages; restart it with the key", "queues", n)
	}
	b.wg.Add(1)
	go b.tickLoop()
	return b, nil
}

// Sealer is the node's QUEEN_ENCRYPTION_KEY sealer, nil when the node has
// no key. Connectors seal their database passwords with it.
func (b *Broker) Sealer() *seal.Sealer { return b.sealer }

// Node is the underlying replication node, for tests that drive the
// cluster itself; the HTTP layer, the connectors and cmd/queen use the
// broker's own methods.
func (b *Broker) Node() *cluster.Node { return b.node }

// Drain ends long polls (they answer with nothing) and stops proposing
// ticks; the node keeps serving other requests until Close.
func (b *Broker) Drain() {
	b.drainOnce.Do(func() {
		close(b.closing)
		b.waiters.closeAll()
	})
}

// Close stops the broker and its node.
func (b *Broker) Close() error {
	b.Drain()
	b.wg.Wait()
	return b.node.Close()
}

// WaitReady blocks until the node can serve (a leader exists).
func (b *Broker) WaitReady(ctx context.Context) error { return b.node.WaitLeader(ctx) }

// submit proposes a command and waits for its result.
func (b *Broker) submit(ctx context.Context, cmd state.Command, size int) (any, error) {
	start := time.Now()
	defer b.observeSubmit(start)
	return b.node.Submit(ctx, cmd, size)
}

// tickLoop proposes a Tick when a lease expiry or a delayed partition is due.
func (b *Broker) tickLoop() {
	defer b.wg.Done()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-b.closing:
			return
		case <-t.C:
		}
		if !b.node.IsLeader() {
			continue
		}
		d := b.node.Store().Deadline()
		if d == 0 || d > time.Now().UnixMicro() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := b.submit(ctx, &state.Tick{}, 8); err != nil {
			b.log.Debug("tick failed", "err", err)
		}
		cancel()
	}
}

// reader returns a snapshot reader after a linearizable read barrier.
func (b *Broker) reader(ctx context.Context) (*state.Reader, error) {
	if ctx.Value(staleKey{}) == nil {
		if err := b.node.ReadBarrier(ctx); err != nil {
			return nil, err
		}
	}
	return b.node.Store().Reader(), nil
}

type staleKey struct{}

// AllowStale marks a read as content with this node's own state, without
// asking the leader: a follower may be behind, and a node cut off from the
// majority still answers. For status pages and dashboards; reads without
// it are linearizable.
func AllowStale(ctx context.Context) context.Context {
	return context.WithValue(ctx, staleKey{}, true)
}

func init() {
	// Random bytes for ids are read from the system in batches rather than
	// one read per id (a push of 100 messages without ids needs 100).
	uuid.EnableRandPool()
}

func newID() string {
	u, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return u.String()
}
