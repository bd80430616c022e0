package pgsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/connector"
)

// Defaults of the source block (the connector reference), applied when a
// field is zero: the runtime validates and fills documents, tests and
// older documents may not.
const (
	defaultChunkRows     = 2000
	defaultBundleMsgs    = 1000
	defaultBundleBytes   = 4 << 20
	defaultLingerMs      = 20
	defaultHeartbeatSecs = 10
	defaultLeaseTTL      = 10 * time.Second
)

// Source is one source connector on this node.
type Source struct {
	env    connector.Env
	spec   connector.SourceSpec
	name   string
	slot   string
	pub    string
	manage bool
	log    *slog.Logger
	// linger is how long a bundle waits for more transactions.
	linger    time.Duration
	heartbeat time.Duration
	leaseTTL  time.Duration

	// hooks lets tests stop the source at chosen points (nil in
	// production).
	hooks *hooks
}

// hooks are fault-injection points for tests.
type hooks struct {
	// beforeCommit runs before a bundle's broker transaction; an error
	// aborts the run as if the process died there.
	beforeCommit func(msgs int, p *pointer) error
	// txn stands in for a bundle's broker transaction: do proposes it
	// (and waits for the answer), queued lets the next bundle be proposed
	// (as do does once the transaction is queued for the log).
	txn func(msgs int, p *pointer, queued func(), do func() error) error
	// depth replaces pipelineDepth (0: the default).
	depth int
	// handed runs once the reader handed a bundle to the committer.
	handed func(msgs int, p *pointer)
	// afterCommit runs once the broker committed a bundle, before its
	// position is confirmed to PostgreSQL.
	afterCommit func(msgs int, p *pointer) error
	// waitSynced, under interval durability, stands in for the call of
	// broker.WaitSynced (wait) that makes committed positions
	// confirmable; statusSent runs after each standby status update with
	// the position it confirmed.
	waitSynced func(ctx context.Context, wait func(context.Context) error) error
	statusSent func(flushed pglogrepl.LSN)
	// afterLow runs once a chunk's low watermark is written, before the
	// chunk is read (changes made here fall between the markers).
	afterLow func(table string)
	// beforeLow runs before a chunk's low watermark is written.
	beforeLow func(table string)
	// beforeHigh runs once a chunk is read, before its high watermark is
	// written; afterHigh once it is written, with the LSN where the
	// marker's record ends.
	beforeHigh func(table string)
	afterHigh  func(table string, high pglogrepl.LSN)
	// leaseTTL replaces the lease's TTL; keepLease leaves the lease in
	// place when Run ends, as a killed process would.
	leaseTTL  time.Duration
	keepLease bool
}

// New builds the source of env's document. It does not connect.
func New(env connector.Env) (connector.Runner, error) {
	if env.Doc.Kind != connector.KindSource || env.Doc.Source == nil {
		return nil, fmt.Errorf("pgsource: document %q is kind %q without a source block; want kind source", env.Doc.Name, env.Doc.Kind)
	}
	if env.Broker == nil {
		return nil, errors.New("pgsource: no broker")
	}
	spec := *env.Doc.Source
	if len(spec.Tables) == 0 {
		return nil, connector.Errorf("invalid_connector", nil, "source.tables must name 1 to 256 tables")
	}
	if spec.SnapshotChunkRows == 0 {
		spec.SnapshotChunkRows = defaultChunkRows
	}
	if spec.MaxBundleMessages == 0 {
		spec.MaxBundleMessages = defaultBundleMsgs
	}
	if spec.MaxBundleBytes == 0 {
		spec.MaxBundleBytes = defaultBundleBytes
	}
	if spec.HeartbeatSeconds == 0 {
		spec.HeartbeatSeconds = defaultHeartbeatSecs
	}
	if spec.Snapshot == "" {
		spec.Snapshot = "initial"
	}
	if spec.OnTruncate == "" {
		spec.OnTruncate = "skip"
	}
	base := connector.DefaultSlotName(env.Tenant, env.Doc.Name)
	if spec.Slot == "" {
		spec.Slot = base
	}
	if spec.Publication == "" {
		spec.Publication = base
	}
	if env.Status == nil {
		env.Status = connector.NewStatusReporter(connector.PhaseConnecting)
	}
	if env.Metrics == nil {
		env.Metrics = nopMetrics()
	}
	log := env.Log
	if log == nil {
		log = slog.Default()
	}
	s := &Source{
		env: env, spec: spec, name: env.Doc.Name, slot: spec.Slot, pub: spec.Publication,
		manage: spec.ManagePublication == nil || *spec.ManagePublication,
		log:    log.With("connector", env.Doc.Name, "slot", spec.Slot),
		linger: time.Duration(spec.LingerMs) * time.Millisecond, heartbeat: time.Duration(spec.HeartbeatSeconds) * time.Second,
		leaseTTL: env.LeaseTTL,
	}
	if s.leaseTTL <= 0 {
		s.leaseTTL = defaultLeaseTTL
	}
	return s, nil
}

// Run owns the source while this node holds its lease, and waits in
// standby while another node does.
func (s *Source) Run(ctx context.Context) error {
	ttl := s.leaseTTL
	if s.hooks != nil && s.hooks.leaseTTL > 0 {
		ttl = s.hooks.leaseTTL
	}
	ls := connector.NewLease(s.env.Broker, s.env.Tenant, connector.LeaseKey(s.name), s.env.NodeID, ttl)
	defer func() {
		if s.hooks != nil && s.hooks.keepLease {
			return
		}
		if err := ls.Release(); err != nil {
			s.log.Warn("could not give back the source's lease; another node takes over once it runs out", "err", err)
		}
	}()
	for {
		held, holder, err := ls.Acquire(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if !held {
			s.env.Metrics.Owner.Set(0)
			s.env.Status.SetPhase(connector.PhaseStandby)
			s.env.Status.Update(func(st *connector.Status) { st.Owner = false })
			s.log.Debug("another node owns the source", "owner", holder)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(ls.TTL() / 3):
			}
			continue
		}
		err = s.runOwned(ctx, ls)
		s.env.Metrics.Owner.Set(0)
		if ctx.Err() != nil {
			return nil
		}
		var lost *lostError
		if errors.As(err, &lost) || errors.Is(err, connector.ErrLeaseLost) {
			s.log.Warn("lost the source to another node; standing by", "err", err)
			continue
		}
		if err != nil {
			// The runtime reports it too (and counts it); setting it here
			// shows it at once.
			s.env.Status.SetError(err)
		}
		return err
	}
}

// runOwned runs the source while the lease is held: a renewal loop beside
// the work cancels it the moment the lease is lost.
func (s *Source) runOwned(ctx context.Context, ls *connector.Lease) error {
	octx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(ls.TTL() / 3)
		defer t.Stop()
		for {
			select {
			case <-octx.Done():
				return
			case <-t.C:
				if err := ls.Renew(octx); err != nil {
					if errors.Is(err, connector.ErrLeaseLost) {
						cancel(err)
						return
					}
					s.log.Warn("could not renew the source's lease; trying again", "err", err)
				}
			}
		}
	}()
	s.env.Metrics.Owner.Set(1)
	s.env.Status.Update(func(st *connector.Status) { st.Owner = true })
	r := &run{s: s}
	err := r.run(octx)
	r.close()
	cancel(nil)
	<-done
	if cause := context.Cause(octx); errors.Is(cause, connector.ErrLeaseLost) {
		return cause
	}
	return err
}

// run is one owned run of a source: its connections, its pointer and its
// stream.
type run struct {
	s      *Source
	q      *pgx.Conn
	rc     *pgconn.PgConn
	st     *stream
	tables []*tableInfo
	byName map[string]*tableInfo
	rels   map[uint32]*relation
	ps     pointerStore
	// ptr is the committed pointer (the committer's once the loop runs);
	// pend the pointer once the pending batch is pushed.
	ptr  *pointer
	pend *pointer
	// dirty: pend differs from what was handed to the committer.
	dirty bool
	// broken: a bundle could not be handed over; nothing more may be.
	broken   bool
	c        *committer
	deadline time.Time
	enc      encoder
	b        batch
	cur      curTxn
	change   change
	fill     tuple
	// lastData is when the stream last carried a change of the tables.
	lastData time.Time
	lastHB   time.Time
	lastLag  time.Time
	snap     *snapshotter
	// cpuHeld: the reader holds the node's CPU slot (cpuHold).
	cpuHeld bool
}

// curTxn is the source transaction being read.
type curTxn struct {
	open    bool
	skipAll bool
	skip    int // changes to drop (resume inside a split transaction)
	seq     int // changes seen so far
	t       txn
}

func (r *run) close() {
	if r.st != nil {
		r.st.stopWatch()
	}
	if r.rc != nil {
		r.rc.Close(context.Background())
	}
	if r.q != nil {
		r.q.Close(context.Background())
	}
}

func (r *run) run(ctx context.Context) error {
	s := r.s
	if s.env.Doc.Deleting {
		s.env.Status.SetPhase(connector.PhaseDeleting)
	} else {
		s.env.Status.SetPhase(connector.PhaseConnecting)
	}
	if err := r.setup(ctx); err != nil || r.st == nil {
		return err
	}
	return r.loop(ctx)
}

// setup checks everything before touching PostgreSQL, then manages the
// publication, finds or creates the slot, checks it against the pointer,
// and starts the stream (r.st stays nil when there is nothing to stream:
// a deleted source).
func (r *run) setup(ctx context.Context) error {
	s := r.s
	var err error
	if r.q, err = dialQuery(ctx, s.env); err != nil {
		return err
	}
	if err := checkServer(ctx, r.q); err != nil {
		return err
	}
	r.ps = pointerStore{b: s.env.Broker, tenant: s.env.Tenant, key: connector.PointerKey(s.name)}
	if s.env.Doc.Deleting {
		return r.deleteSource(ctx)
	}
	if r.tables, err = loadTables(ctx, r.q, s.spec.Tables); err != nil {
		return err
	}
	if s.spec.OnTruncate == "emit" {
		for i, t := range r.tables {
			if !t.single {
				return connector.Errorf("invalid_connector", nil, "source.onTruncate is \"emit\", but source.tables[%d] (%s) is not partitionBy \"single\"; set partitionBy \"single\" on every table, or onTruncate \"skip\"", i, t.name)
			}
		}
	}
	r.byName = make(map[string]*tableInfo, len(r.tables))
	for _, t := range r.tables {
		r.byName[t.name] = t
	}
	r.rels = map[uint32]*relation{}
	if s.manage {
		err = managePublication(ctx, r.q, s.pub, r.tables)
	} else {
		err = checkPublication(ctx, r.q, s.pub, r.tables)
	}
	if err != nil {
		return err
	}
	if r.rc, err = dialReplication(ctx, s.env); err != nil {
		return err
	}
	sys, err := pglogrepl.IdentifySystem(ctx, r.rc)
	if err != nil {
		return fmt.Errorf("identify the PostgreSQL system: %w", err)
	}
	p, err := r.ps.load(ctx)
	if err != nil {
		return err
	}
	if p != nil && p.Resync < s.env.Doc.Resync {
		s.log.Info("resync: dropping the slot and starting a new epoch", "oldEpoch", p.Epoch)
		if err := r.dropSlot(ctx); err != nil {
			return err
		}
		p = r.newPointer(p.Epoch, sys)
		p.Resync = s.env.Doc.Resync
		if err := r.createSlot(ctx, p); err != nil {
			return err
		}
	} else if p == nil {
		if err := r.waitSlotFree(ctx); err != nil {
			return err
		}
		// A slot without a pointer holds nothing pushed: start over.
		if err := r.dropSlot(ctx); err != nil {
			return err
		}
		p = r.newPointer("", sys)
		p.Resync = s.env.Doc.Resync
		if err := r.createSlot(ctx, p); err != nil {
			return err
		}
	} else {
		if err := r.checkSlot(ctx, p, sys); err != nil {
			return err
		}
	}
	// Tables added since the epoch began are streamed, not copied; tables
	// removed are forgotten.
	for _, t := range r.tables {
		if _, ok := p.Snapshot.Tables[t.name]; !ok {
			p.Snapshot.Tables[t.name] = &tableState{Done: true}
		}
	}
	for name := range p.Snapshot.Tables {
		if r.byName[name] == nil {
			delete(p.Snapshot.Tables, name)
		}
	}
	r.ptr, r.pend = p, p.clone()
	r.publishStatus()
	r.st, err = startStream(ctx, r.rc, s.slot, s.pub, pglogrepl.LSN(p.FlushLSN))
	if err != nil {
		return err
	}
	if s.hooks != nil {
		r.st.sent = s.hooks.statusSent
	}
	r.snap = newSnapshotter(r)
	r.lastData, r.lastHB = time.Now(), time.Now()
	if r.snap.pending() {
		s.env.Status.SetPhase(connector.PhaseSnapshot)
	} else {
		s.env.Status.SetPhase(connector.PhaseStreaming)
	}
	s.log.Info("streaming", "from", pglogrepl.LSN(p.FlushLSN), "epoch", p.Epoch)
	return nil
}

// newPointer is the pointer of a new epoch: nothing pushed yet, every table
// to copy (unless snapshot is "never").
func (r *run) newPointer(prevEpoch string, sys pglogrepl.IdentifySystemResult) *pointer {
	p := &pointer{Epoch: newEpoch(prevEpoch), SystemID: sys.SystemID, Timeline: sys.Timeline, Slot: r.s.slot, Seq: -1,
		Snapshot: snapshotState{Tables: map[string]*tableState{}}}
	never := r.s.spec.Snapshot == "never"
	for _, t := range r.tables {
		p.Snapshot.Tables[t.name] = &tableState{Done: never}
	}
	p.Snapshot.Done = never
	return p
}

// deleteSource is a DELETE: drop the slot (and a managed publication),
// the pointer, then the document; then wait to be stopped.
func (r *run) deleteSource(ctx context.Context) error {
	s := r.s
	if err := r.waitSlotFree(ctx); err != nil {
		return err
	}
	if err := r.dropSlot(ctx); err != nil {
		return err
	}
	if s.manage {
		if err := dropPublication(ctx, r.q, s.pub); err != nil {
			return err
		}
	}
	if _, err := r.ps.load(ctx); err != nil {
		return err
	}
	if err := r.ps.delete(ctx); err != nil {
		return err
	}
	if s.env.Remove != nil {
		if err := s.env.Remove(ctx); err != nil {
			return fmt.Errorf("remove the deleted source's document: %w", err)
		}
	}
	s.log.Info("deleted: dropped the slot and the pointer", "publicationDropped", s.manage)
	<-ctx.Done()
	return nil
}

// publishStatus shows the committed pointer in the status and metrics.
func (r *run) publishStatus() {
	lsn := pglogrepl.LSN(r.ptr.FlushLSN)
	r.s.env.Metrics.SourcePointerLSN.Set(float64(lsn))
	r.s.env.Status.Update(func(st *connector.Status) { st.PointerLSN = lsn.String() })
}
