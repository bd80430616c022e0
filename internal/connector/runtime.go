package connector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/queen-mq/queen/internal/broker"
)

// RuntimeConfig configures a node's connector runtime.
type RuntimeConfig struct {
	Broker   *broker.Broker
	Settings Settings
	// Factories build the Runner of each kind (KindSource, KindSink).
	// cmd/queen registers the PostgreSQL connectors here, so this package
	// imports neither. A kind without a factory shows as an error.
	Factories map[string]Factory
	Logger    *slog.Logger
}

// Backoff bounds of a connector that failed.
const (
	minBackoff = time.Second
	maxBackoff = time.Minute
)

type connKey struct{ tenant, name string }

// Runtime runs every tenant's connectors on this node: it re-reads the
// documents every Settings.Reload (and at once after a write through this
// node), starts a Runner for each through its kind's Factory, restarts it
// when its document changes, retries a failed one after a backoff, stops
// the ones whose document is gone, and keeps this node's status of each.
type Runtime struct {
	cfg     RuntimeConfig
	log     *slog.Logger
	store   *Store
	pool    *Pool
	metrics *promMetrics
	kick    chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	loopWG sync.WaitGroup

	mu       sync.Mutex
	entries  map[connKey]*entry
	statuses map[connKey]*StatusReporter
	started  bool
	stopped  bool
}

// entry is one connector running on this node.
type entry struct {
	tenant string
	doc    Document
	cancel context.CancelFunc
	done   chan struct{}
	m      *ConnectorMetrics
}

// NewRuntime builds the runtime; Start starts it.
func NewRuntime(cfg RuntimeConfig) *Runtime {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Settings.Reload <= 0 {
		cfg.Settings.Reload = DefaultSettings().Reload
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Runtime{
		cfg: cfg, log: cfg.Logger.With("component", "connectors"), store: NewStore(cfg.Broker),
		pool: NewPool(cfg.Settings.Threads), metrics: newPromMetrics(), kick: make(chan struct{}, 1),
		ctx: ctx, cancel: cancel, entries: map[connKey]*entry{}, statuses: map[connKey]*StatusReporter{},
	}
}

// Settings are the runtime's settings.
func (rt *Runtime) Settings() Settings { return rt.cfg.Settings }

// Register adds the connector metrics to reg.
func (rt *Runtime) Register(reg prometheus.Registerer) error { return rt.metrics.register(reg) }

// Start runs the reload loop until Stop. With QUEEN_PG_CONNECTORS=false it
// runs nothing: every connector shows phase disabled.
func (rt *Runtime) Start() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.started || rt.stopped || !rt.cfg.Settings.Enabled {
		return
	}
	rt.started = true
	rt.loopWG.Add(1)
	go rt.loop()
}

// Kick asks for a reload now (a document was written through this node).
func (rt *Runtime) Kick() {
	select {
	case rt.kick <- struct{}{}:
	default:
	}
}

func (rt *Runtime) loop() {
	defer rt.loopWG.Done()
	t := time.NewTicker(rt.cfg.Settings.Reload)
	defer t.Stop()
	for {
		rt.reload()
		select {
		case <-rt.ctx.Done():
			return
		case <-t.C:
		case <-rt.kick:
		}
	}
}

// reload brings the running connectors in line with the stored documents.
// A failed read changes nothing: the connectors keep running.
func (rt *Runtime) reload() {
	ctx, cancel := context.WithTimeout(rt.ctx, rt.cfg.Settings.Reload+10*time.Second)
	defer cancel()
	all, err := rt.store.ListAll(ctx)
	if err != nil {
		if rt.ctx.Err() == nil {
			rt.log.Warn("cannot read the connector documents; the running connectors keep running and the read is retried", "err", err, "every", rt.cfg.Settings.Reload)
		}
		return
	}
	seen := make(map[connKey]bool, len(all))
	for _, st := range all {
		k := connKey{st.Tenant, st.Doc.Name}
		seen[k] = true
		rt.mu.Lock()
		e := rt.entries[k]
		rt.mu.Unlock()
		if e != nil && e.doc.Version == st.Doc.Version {
			continue
		}
		if e != nil {
			rt.log.Info("connector changed; restarting it", "connector", k.name, "tenant", k.tenant, "version", st.Doc.Version)
			rt.stopEntry(k, e, false)
		} else {
			rt.log.Info("starting connector", "connector", k.name, "tenant", k.tenant, "kind", st.Doc.Kind, "version", st.Doc.Version)
		}
		if rt.ctx.Err() != nil {
			return
		}
		rt.startEntry(k, st.Doc)
	}
	rt.mu.Lock()
	var gone []connKey
	for k := range rt.entries {
		if !seen[k] {
			gone = append(gone, k)
		}
	}
	rt.mu.Unlock()
	for _, k := range gone {
		rt.mu.Lock()
		e := rt.entries[k]
		rt.mu.Unlock()
		rt.log.Info("connector deleted; stopping it", "connector", k.name, "tenant", k.tenant)
		rt.stopEntry(k, e, true)
	}
}

func (rt *Runtime) reporter(k connKey) *StatusReporter {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	r := rt.statuses[k]
	if r == nil {
		r = NewStatusReporter(PhaseConnecting)
		rt.statuses[k] = r
	}
	return r
}

func (rt *Runtime) startEntry(k connKey, doc Document) {
	rep := rt.reporter(k)
	if doc.Deleting {
		rep.SetPhase(PhaseDeleting)
	} else {
		rep.SetPhase(PhaseConnecting)
	}
	ctx, cancel := context.WithCancel(rt.ctx)
	e := &entry{tenant: k.tenant, doc: doc, cancel: cancel, done: make(chan struct{}), m: rt.metrics.forConnector(k.name, k.tenant)}
	rt.mu.Lock()
	if rt.stopped {
		rt.mu.Unlock()
		cancel()
		return
	}
	rt.entries[k] = e
	rt.mu.Unlock()
	go rt.run(ctx, k, e, rep)
}

// stopEntry cancels a connector and waits for it (at most the shutdown
// grace). deleted drops its status and metrics as well.
func (rt *Runtime) stopEntry(k connKey, e *entry, deleted bool) {
	e.cancel()
	rt.wait(k, e)
	rt.mu.Lock()
	if rt.entries[k] == e {
		delete(rt.entries, k)
	}
	if deleted {
		delete(rt.statuses, k)
	}
	rt.mu.Unlock()
	if deleted {
		rt.metrics.drop(k.name, k.tenant)
	}
}

func (rt *Runtime) wait(k connKey, e *entry) {
	grace := rt.cfg.Settings.ShutdownGrace
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-e.done:
	case <-t.C:
		rt.log.Error("connector did not stop within the shutdown grace; moving on without it", "connector", k.name, "tenant", k.tenant,
			"grace", grace, "fix", "raise QUEEN_PG_SHUTDOWN_GRACE_MS if its work in flight needs longer")
	}
}

// run runs one connector until ctx ends, retrying failures with backoff.
func (rt *Runtime) run(ctx context.Context, k connKey, e *entry, rep *StatusReporter) {
	defer close(e.done)
	log := rt.log.With("connector", k.name, "tenant", k.tenant, "kind", e.doc.Kind)
	backoff := minBackoff
	lastCode := ""
	for {
		start := time.Now()
		err := rt.runOnce(ctx, k, e, rep, log)
		e.m.Owner.Set(0)
		if e.doc.Kind == KindSource {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if rerr := releaseIfHolder(rctx, rt.cfg.Broker, k.tenant, LeaseKey(k.name), rt.cfg.Broker.NodeID()); rerr != nil {
				log.Warn("could not give back the source's lease; another node takes it once its TTL runs out", "err", rerr)
			}
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > maxBackoff {
			backoff = minBackoff
		}
		if err == nil {
			log.Info("connector stopped on its own; starting it again", "after", backoff)
		} else {
			rep.SetError(err)
			e.m.Errors.Add(1)
			st := rep.Get()
			if st.Code != lastCode {
				log.Error("connector failed; retrying with backoff", "code", st.Code, "fix", st.Message, "err", err)
			} else {
				log.Debug("connector failed again", "code", st.Code, "err", err)
			}
			lastCode = st.Code
		}
		d := backoff + time.Duration(rand.Int64N(int64(backoff)/4+1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// runOnce builds and runs the Runner once; a panic in it is an error, never
// a crash of the broker.
func (rt *Runtime) runOnce(ctx context.Context, k connKey, e *entry, rep *StatusReporter, log *slog.Logger) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("connector panicked: %v", v)
		}
	}()
	password, err := Unseal(rt.cfg.Broker.Sealer(), e.doc)
	if err != nil {
		return err
	}
	f := rt.cfg.Factories[e.doc.Kind]
	if f == nil {
		return Errorf("unsupported", nil, "this build of the broker has no %s connector", e.doc.Kind)
	}
	doc := e.doc
	env := Env{
		Broker: rt.cfg.Broker, Tenant: k.tenant, Doc: doc, Password: password, NodeID: rt.cfg.Broker.NodeID(),
		LeaseTTL: rt.cfg.Settings.LeaseTTL, AllowPrivateNetworks: rt.cfg.Settings.AllowPrivateNetworks,
		Status: rep, Metrics: e.m, CPU: rt.pool, Log: log,
		Remove: func(ctx context.Context) error {
			err := rt.store.Remove(ctx, k.tenant, k.name, doc.Version)
			rt.Kick()
			return err
		},
	}
	r, err := f(env)
	if err != nil {
		return err
	}
	if r == nil {
		return errors.New("the connector's factory returned no runner")
	}
	return r.Run(ctx)
}

// Stop stops every connector, waiting at most the shutdown grace for their
// work in flight, and gives back the sources' leases this node holds so
// another node takes over at once. The broker must still be open.
func (rt *Runtime) Stop() {
	rt.mu.Lock()
	if rt.stopped {
		rt.mu.Unlock()
		return
	}
	rt.stopped = true
	rt.mu.Unlock()
	rt.cancel()
	rt.loopWG.Wait()
	rt.mu.Lock()
	entries := make(map[connKey]*entry, len(rt.entries))
	for k, e := range rt.entries {
		entries[k] = e
	}
	rt.mu.Unlock()
	deadline := time.Now().Add(rt.cfg.Settings.ShutdownGrace)
	for k, e := range entries {
		select {
		case <-e.done:
		case <-time.After(time.Until(deadline)):
			rt.log.Error("connector did not stop within the shutdown grace", "connector", k.name, "tenant", k.tenant,
				"grace", rt.cfg.Settings.ShutdownGrace, "fix", "raise QUEEN_PG_SHUTDOWN_GRACE_MS if its work in flight needs longer")
		}
	}
}

// Status is this node's status of a connector. A document this node has
// not loaded yet is connecting; with QUEEN_PG_CONNECTORS=false every
// connector is disabled.
func (rt *Runtime) Status(tenant string, doc Document) Status {
	now := time.Now().UTC()
	if rt == nil {
		return Status{Phase: PhaseDisabled, Since: now, Message: "connectors do not run in this process"}
	}
	if !rt.cfg.Settings.Enabled {
		return Status{Phase: PhaseDisabled, Since: now, Message: "QUEEN_PG_CONNECTORS is false on this node, so it runs no connectors; another node may run it"}
	}
	rt.mu.Lock()
	r := rt.statuses[connKey{tenant, doc.Name}]
	e := rt.entries[connKey{tenant, doc.Name}]
	rt.mu.Unlock()
	if r == nil || e == nil {
		st := Status{Phase: PhaseConnecting, Since: now, Message: "this node has not loaded this version of the document yet; it re-reads the documents every QUEEN_PG_RELOAD_MS"}
		if doc.Deleting {
			st.Phase = PhaseDeleting
		}
		return st
	}
	return r.Get()
}

// Running lists the connectors running on this node (tenant/name and
// version), in order; for tests and diagnostics.
func (rt *Runtime) Running() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []string
	for k, e := range rt.entries {
		out = append(out, fmt.Sprintf("%s/%s@%d", k.tenant, k.name, e.doc.Version))
	}
	sort.Strings(out)
	return out
}
