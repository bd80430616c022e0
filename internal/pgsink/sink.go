package pgsink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// sink is one sink document's work on this node.
type sink struct {
	env      connector.Env
	spec     connector.SinkSpec
	name     string // the progress table's sink column
	table    ident
	progress ident
	params   []param
	log      *slog.Logger
	// rows committed by the COPY path and by the populate path; batches
	// written in one round trip, those whose known offsets had moved,
	// those written before the answer to the one before, and pipelined
	// ones that failed and were done again
	copied, populated, oneTrip, moved, pipelined, redone atomic.Int64
	binarySent                                           atomic.Int64 // rows sent in binary COPY data, redone ones again
	typedArrays                                          atomic.Int64 // upsert arrays bound in binary, of types other than text
	// awaited: next batches that came in while a worker waited (awaitPop)
	awaited atomic.Int64
	// barriers: batches whose commit waited for the flush (closed a group
	// for its size, its age, or no next batch ready), and barriers run as
	// transactions of their own
	barrierFull, barrierAge, barrierIdle, barrierOwn atomic.Int64
	// groups left open on a bet that the pop under way comes back in
	// time, and those bets lost (closesGroup)
	bets, betsLost atomic.Int64
	// the offsets this node's sink committed last, per partition
	known knownOffsets
	// the barrier found synchronous_commit off (logged once)
	syncOffLogged atomic.Bool
}

// New is the sink's connector.Factory. It only reads the document; Run
// connects.
func New(env connector.Env) (connector.Runner, error) {
	if env.Doc.Kind != connector.KindSink || env.Doc.Sink == nil {
		return nil, fmt.Errorf("pgsink: document %q is not a sink", env.Doc.Name)
	}
	if env.Broker == nil {
		return nil, errors.New("pgsink: no broker")
	}
	s := &sink{env: env, spec: *env.Doc.Sink, name: connector.QualifiedName(env.Tenant, env.Doc.Name), log: env.Log}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("connector", env.Doc.Name, "tenant", env.Tenant)
	if s.spec.ConsumerGroup == "" {
		s.spec.ConsumerGroup = "pg-" + env.Doc.Name
	}
	if s.spec.SubscriptionMode == "" {
		s.spec.SubscriptionMode = "all"
	}
	s.spec.Batch = clamp(s.spec.Batch, 1, broker.MaxBatch, 500)
	s.spec.Workers = clamp(s.spec.Workers, 1, 32, 1)
	s.spec.LeaseSeconds = clamp(s.spec.LeaseSeconds, broker.MinLeaseSeconds, broker.MaxLeaseSeconds, 60)
	s.spec.MaxAttempts = clamp(s.spec.MaxAttempts, 1, 100, 3)
	if s.spec.ProgressTable == "" {
		s.spec.ProgressTable = "queen.sink_progress"
	}
	s.table = parseIdent(s.spec.Table)
	s.progress = parseIdent(s.spec.ProgressTable)
	for _, p := range s.spec.Params {
		prm, err := parseParam(p)
		if err != nil {
			return nil, connector.Errorf("statement", err, "sink.params: %v", err)
		}
		s.params = append(s.params, prm)
	}
	return s, nil
}

func clamp(v, lo, hi, def int) int {
	if v == 0 {
		return def
	}
	return min(max(v, lo), hi)
}

// Run checks the table, then runs the workers until ctx ends. A coded
// error (a setup the user must fix) stops every worker and is returned.
func (s *sink) Run(ctx context.Context) error {
	conn, p, err := s.connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		s.fail(err)
		return err
	}
	s.env.Status.SetPhase(connector.PhaseRunning)
	s.log.Info("sink running", "queue", s.spec.Queue, "table", s.table.String(), "mode", s.spec.Mode, "workers", s.spec.Workers)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for i := 0; i < s.spec.Workers; i++ {
		w := &worker{s: s, id: i, plan: p, stmts: map[string]string{}}
		if i == 0 {
			w.conn = conn
		} else if c, err := s.workerConn(ctx); err == nil {
			w.conn = c
		} // else the worker connects when its first batch comes
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.run(ctx); err != nil {
				cancel(err)
			}
			if w.conn != nil {
				w.conn.Close(context.Background())
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		s.fail(err)
		return err
	}
	return nil
}

func (s *sink) fail(err error) {
	s.env.Status.SetError(err)
	s.env.Metrics.Errors.Add(1)
	s.log.Error("sink stopped", "err", err)
}

// connect opens a connection and runs the start checks on it.
func (s *sink) connect(ctx context.Context) (*pgx.Conn, *plan, error) {
	conn, err := connector.Connect(ctx, s.env)
	if err != nil {
		return nil, nil, err
	}
	p, err := s.check(ctx, conn)
	if err != nil {
		conn.Close(context.Background())
		return nil, nil, err
	}
	return conn, p, nil
}

// workerConn opens a worker's connection (with the sql mode's statement
// prepared on it).
func (s *sink) workerConn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := connector.Connect(ctx, s.env)
	if err != nil {
		return nil, err
	}
	if s.spec.Mode == connector.ModeSQL {
		if err := s.checkStatement(ctx, conn); err != nil {
			conn.Close(context.Background())
			return nil, err
		}
	}
	return conn, nil
}

// worker pops batches with its own lease and applies them on its own
// connection.
type worker struct {
	s     *sink
	id    int
	conn  *pgx.Conn
	plan  *plan
	stmts map[string]string
	acks  chan []*pending
	// committed batches waiting for a barrier, in commit order
	pending []*pending
	// the pop loop's batches; ahead: one taken from it to see whether a
	// next batch is ready
	pops     <-chan *broker.PopResponse
	ahead    *broker.PopResponse
	popsDone bool
	// renewers extend the leases of popped batches not yet written (the
	// one ahead, the one waiting in the pop loop), by lease id; batch takes
	// a batch's renewer over, release stops it
	rmu      sync.Mutex
	renewers map[string]*renewer
	// decoded: batches the pop loop grouped and decoded while the worker
	// wrote the one before, by lease id
	decoded map[string]*decodedBatch
	runCtx  context.Context
	// closing: the batch being written is a barrier; flushed: the last
	// one committed was
	closing, flushed bool
	// openBet: the open group was left open with no next batch ready,
	// on a bet that the pop under way comes back in time; noBets: batches
	// to close without a bet after one was lost (closesGroup)
	openBet bool
	noBets  int
	// the COPY path's staging table is on this connection; noStage: the
	// role may not create it
	staged  *pgconn.PgConn
	noStage bool
	// the progress statements are prepared on this connection;
	// durableCommit: its synchronous_commit for a barrier; nameLit: the
	// sink's name as an SQL literal
	prepared      *pgconn.PgConn
	durableCommit string
	nameLit       string
	copyBuf       []byte
	binKinds      map[string][]binKind // by column set: binary COPY's forms, nil where a column has none (copybinary.go)
	ups           upsertStmts          // upserts prepared on this connection (upsertbind.go)
	copyRd        *bytes.Reader        // the COPY data's reader, reused after a COPY that succeeded
	wire          []byte               // a pipelined batch's protocol messages (write)
	ackBuf        []broker.AckItem     // the ack goroutine's items, reused
	freeBufs      []*decodeBufs        // decode storage of committed batches, for the next ones (under rmu)
	fields        [][]byte             // a run's COPY fields, reused by unnestParams
	// batches written and not answered yet, oldest first (pipeline.go);
	// answers: how long this connection's answers take
	flights []*flight
	answers answerTime
	// failed: a coded or fatal error met outside the batch being written
	failed error
}

const (
	// popAhead is how many popped batches wait in the pop loop of a
	// worker alone, popAheadShared in that of a worker of several (run).
	popAhead       = 1
	popAheadShared = 2
	popWait        = 2 * time.Second
	minBackoff     = 100 * time.Millisecond
	maxBackoff     = 5 * time.Second
)

func (w *worker) run(ctx context.Context) error {
	// Acks go out from a goroutine of their own, in order, so the acks of
	// durable batches overlap the next batches' pops and writes.
	w.acks = make(chan []*pending, 1)
	acked := make(chan struct{})
	go func() {
		defer close(acked)
		for ps := range w.acks {
			w.ack(ctx, ps)
		}
	}()
	defer func() {
		if err := w.drain(ctx); err != nil && w.failed == nil {
			w.failed = err
		}
		w.settle(ctx)
		close(w.acks)
		<-acked
	}()
	// The next batch is popped while this one is written: besides the one
	// the worker took to look ahead, popAhead wait in the pop loop (each
	// leased and renewed); those not written by the end are handed back.
	// A worker held up (at a barrier) keeps popping messages whose leases
	// ran out elsewhere, up to that many. A worker alone keeps one: its
	// bet on the pop under way (closesGroup) keeps its groups open, and
	// two did not raise its rate. A worker of several keeps two: its pops
	// compete with the others', and with one its next batch was ready for
	// only a quarter to a third of its batches, so nearly every batch
	// closed its group and waited for a flush (docs/benchmarks.md).
	ahead := popAhead
	if w.s.spec.Workers > 1 {
		ahead = popAheadShared
	}
	pops := make(chan *broker.PopResponse, ahead-1)
	w.pops = pops
	w.runCtx = ctx
	pctx, pcancel := context.WithCancel(ctx)
	go w.popLoop(pctx, pops)
	defer func() {
		pcancel()
		if w.ahead != nil {
			w.release(w.ahead)
			w.ahead = nil
		}
		for resp := range pops {
			w.release(resp)
		}
	}()
	for {
		resp, ok := w.next(ctx)
		if !ok {
			return w.failed
		}
		if err := w.batch(ctx, resp); err != nil {
			w.release(resp)
			return err
		}
		if w.due() {
			w.settle(ctx)
		}
		if w.failed != nil {
			return w.failed
		}
	}
}

// popLoop pops batches into out until ctx ends, then closes it.
func (w *worker) popLoop(ctx context.Context, out chan<- *broker.PopResponse) {
	defer close(out)
	s := w.s
	backoff := minBackoff
	for ctx.Err() == nil {
		resp, err := s.env.Broker.Pop(ctx, broker.PopRequest{
			Tenant: s.env.Tenant, Queue: s.spec.Queue, Group: s.spec.ConsumerGroup,
			Batch: s.spec.Batch, Partitions: min(s.spec.Batch, broker.MaxPartitions), LeaseSeconds: int64(s.spec.LeaseSeconds),
			SubscriptionMode: s.spec.SubscriptionMode, Wait: true, Timeout: popWait,
			Deliveries: true, // the state's records, read once; messages named by partition and offset
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.env.Metrics.Errors.Add(1)
			s.log.Warn("sink pop failed; retrying", "err", err)
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, maxBackoff)
			continue
		}
		backoff = minBackoff
		if len(resp.Delivered) == 0 {
			continue
		}
		// The lease is renewed from the pop on: a batch may wait here or
		// ahead while the worker waits for a barrier.
		w.track(resp)
		// Decoded here, the batch's CPU work overlaps the worker's round
		// trip of the batch before.
		w.predecode(ctx, resp)
		select {
		case out <- resp:
		case <-ctx.Done():
			w.release(resp)
			return
		}
	}
}

// release hands a batch that will not be written back to the group at
// once (ack retry: delivered again, no attempt counted) instead of letting
// its lease run out. Whatever of it was committed is skipped next time.
func (w *worker) release(resp *broker.PopResponse) {
	s := w.s
	w.untrack(resp).stop()
	items := make([]broker.AckItem, len(resp.Delivered))
	for i, m := range resp.Delivered {
		off := m.Offset
		items[i] = broker.AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Offset: &off, Group: s.spec.ConsumerGroup, LeaseID: resp.LeaseID, Status: "retry"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.env.Broker.Ack(ctx, s.env.Tenant, items); err != nil {
		s.log.Warn("sink could not hand a batch back; it returns when its lease ends", "err", err)
	}
}

// batch applies one popped batch: pipelined behind the batches in flight
// when it can be (pipeline.go), else on its own once their answers are in.
func (w *worker) batch(ctx context.Context, resp *broker.PopResponse) error {
	pre := w.takeDecoded(resp)
	lease := w.untrack(resp)
	if lease == nil {
		lease = newRenewer(ctx, w.s, resp.LeaseID)
	}
	if w.send(ctx, resp, pre, lease) {
		if err := w.collect(ctx, maxFlights-1); err != nil {
			w.failed = err
		}
		return nil
	}
	if err := w.drain(ctx); err != nil {
		lease.stop()
		w.failed = err
		w.release(resp)
		return nil
	}
	return w.batchSync(ctx, resp, pre, lease)
}

// batchSync applies one batch on its own, retrying transient failures
// while it still holds the lease, and adds it to the batches waiting for
// a barrier.
func (w *worker) batchSync(ctx context.Context, resp *broker.PopResponse, pre *decodedBatch, lease *renewer) error {
	s := w.s
	kept := false
	defer func() {
		if !kept {
			lease.stop()
		}
	}()
	backoff := minBackoff
	for {
		if ctx.Err() != nil {
			w.release(resp)
			return nil
		}
		if lease.lost() {
			// Another worker gets these messages; the progress rows make
			// whatever this one already committed a no-op there.
			s.log.Warn("sink lost its lease during a batch; the messages come back", "messages", len(resp.Delivered))
			return nil
		}
		if w.conn == nil || w.conn.IsClosed() {
			w.settle(ctx) // none pending: a failure settled them
			conn, err := s.workerConn(ctx)
			if err != nil {
				if _, coded := connector.AsError(err); coded {
					return err
				}
				w.retryable(ctx, err, &backoff)
				continue
			}
			w.conn = conn
			s.env.Status.SetPhase(connector.PhaseRunning)
		}
		w.flushed = false
		res, err := w.apply(ctx, resp.Delivered, pre)
		if err == nil {
			w.recycle(pre)
		}
		pre = nil // a batch done again is decoded again
		if err != nil {
			// The batches pending on this connection are settled before
			// it is retried or dropped: a broken one may have lost them.
			w.settle(ctx)
			if ctx.Err() != nil {
				w.release(resp)
				return nil
			}
			if _, coded := connector.AsError(err); coded {
				return err
			}
			if transient(err) {
				w.retryable(ctx, err, &backoff)
				continue
			}
			return fatal(err, s.table.String())
		}
		if backoff != minBackoff {
			s.env.Status.SetPhase(connector.PhaseRunning)
		}
		if faultAfterCommit != nil && faultAfterCommit() {
			return nil // as if the node died between COMMIT and the ack
		}
		kept = true // renewed until the ack
		w.pending = append(w.pending, &pending{resp: resp, res: res, lease: lease, pc: w.conn.PgConn(), at: time.Now(), durable: w.flushed})
		return nil
	}
}

// retryable logs a transient failure, drops the connection when it is
// broken, and waits out the backoff.
func (w *worker) retryable(ctx context.Context, err error, backoff *time.Duration) {
	s := w.s
	s.env.Metrics.Errors.Add(1)
	s.env.Status.SetError(connector.Errorf("connection", err, "PostgreSQL failed transiently; the sink retries the batch with backoff, nothing is dead-lettered (check the server if this persists)"))
	s.log.Warn("sink batch failed transiently; retrying", "err", err, "backoff", *backoff)
	if w.conn != nil && !w.conn.IsClosed() {
		if _, perr := w.conn.Exec(ctx, "SELECT 1"); perr != nil {
			w.conn.Close(context.Background())
		}
	}
	d := *backoff/2 + time.Duration(rand.Int64N(int64(*backoff/2)+1))
	sleep(ctx, d)
	*backoff = min(*backoff*2, maxBackoff)
}

// ack settles durable batches in Queen, in as few acks as MaxBatch allows:
// applied and skipped messages complete; a refused one is failed
// (delivered again) until its attempt reaches maxAttempts, then
// dead-lettered with the database's error; the messages after it in its
// partition go back untried.
func (w *worker) ack(ctx context.Context, ps []*pending) {
	s := w.s
	// The items in the ack goroutine's buffer (Ack copies them into its
	// command). A batch's messages of one partition written or skipped
	// (status completed) at consecutive offsets are one item, a run
	// (broker.AckItem.Count): a batch of one partition is one item, not
	// one a message, in the sink, the command, the log and the apply. A
	// refused or retried message is an item of its own, with its status.
	items := w.ackBuf[:0]
	defer func() { w.ackBuf = items[:0] }()
	msgs, dlq := 0, 0
	send := func() {
		if len(items) == 0 {
			return
		}
		out, err := s.env.Broker.Ack(context.WithoutCancel(ctx), s.env.Tenant, items)
		if err != nil {
			// The leases run out and the messages come back; the progress
			// rows turn the applied ones into no-ops.
			s.env.Metrics.Errors.Add(1)
			s.log.Warn("sink ack failed; the messages come back after the lease and are skipped", "err", err)
		} else {
			for i, o := range out {
				if o.DLQ && items[i].Status != "dlq" {
					dlq++ // the queue's own retryLimit dead-lettered it first
				}
			}
		}
		items, msgs = items[:0], 0
	}
	for _, p := range ps {
		if msgs+len(p.res.items) > broker.MaxBatch {
			send()
		}
		msgs += len(p.res.items)
		for _, it := range p.res.items {
			off := it.m.Offset
			if it.state != stRefused && it.state != stLater {
				if n := len(items); n > 0 {
					if r := &items[n-1]; r.Status == "completed" && r.LeaseID == p.resp.LeaseID && r.PartitionID == it.m.PartitionID && *r.Offset+max(r.Count, 1) == off {
						r.Count, r.TxID = max(r.Count, 1)+1, "" // a run is named by offsets only
						continue
					}
				}
			}
			a := broker.AckItem{TxID: it.m.TxID, PartitionID: it.m.PartitionID, Offset: &off, Group: s.spec.ConsumerGroup, LeaseID: p.resp.LeaseID, Status: "completed"}
			switch it.state {
			case stRefused:
				a.Error = it.errText
				if int(it.m.Attempt) >= s.spec.MaxAttempts {
					a.Status = "dlq"
					dlq++
					s.log.Warn("sink dead-letters a message the table refuses", "partition", it.m.Partition, "offset", off, "attempt", it.m.Attempt, "error", it.errText)
				} else {
					a.Status = "failed"
					s.log.Info("the table refused a message; it is tried again", "partition", it.m.Partition, "offset", off, "attempt", it.m.Attempt, "error", it.errText)
				}
			case stLater:
				a.Status = "retry"
			}
			items = append(items, a)
		}
	}
	send()
	applied, skipped := 0, 0
	for _, p := range ps {
		applied += p.res.applied
		skipped += p.res.skipped
	}
	s.env.Metrics.SinkBatches.Add(float64(len(ps)))
	s.env.Metrics.SinkApplied.Add(float64(applied))
	s.env.Metrics.SinkSkipped.Add(float64(skipped))
	if dlq > 0 {
		s.env.Metrics.SinkDLQ.Add(float64(dlq))
	}
	if applied > 0 {
		s.env.Status.Update(func(st *connector.Status) { st.Messages += uint64(applied) })
	}
}

// faultAfterCommit is a fault hook for tests: when it returns true the
// worker drops a committed batch without acking it, as a crash between
// PostgreSQL's COMMIT and Queen's ack would.
var faultAfterCommit func() bool

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// track starts renewing a popped batch's lease until batch takes it over
// or release stops it.
func (w *worker) track(resp *broker.PopResponse) {
	ctx := w.runCtx
	if ctx == nil {
		ctx = context.Background()
	}
	r := newRenewer(ctx, w.s, resp.LeaseID)
	w.rmu.Lock()
	defer w.rmu.Unlock()
	if w.renewers == nil {
		w.renewers = map[string]*renewer{}
	}
	if old := w.renewers[resp.LeaseID]; old != nil {
		defer old.stop()
	}
	w.renewers[resp.LeaseID] = r
}

// untrack takes a popped batch's renewer out of the table (nil if none),
// and drops what predecode made of it.
func (w *worker) untrack(resp *broker.PopResponse) *renewer {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	r := w.renewers[resp.LeaseID]
	delete(w.renewers, resp.LeaseID)
	delete(w.decoded, resp.LeaseID)
	return r
}

// decodedBatch is a popped batch grouped into its partitions and decoded,
// once done is closed; ok says the decoding finished.
type decodedBatch struct {
	done  chan struct{}
	ok    bool
	items []*item
	parts []*partWork
	bufs  *decodeBufs // the storage of its ops and lines
}

// predecode starts grouping and decoding a popped batch for the worker (which
// does it itself when this could not). The batch is ready for the worker
// at once: the worker counts it as its next batch and waits for the
// decoding only when it takes it.
func (w *worker) predecode(ctx context.Context, resp *broker.PopResponse) {
	d := &decodedBatch{done: make(chan struct{})}
	w.rmu.Lock()
	if w.decoded == nil {
		w.decoded = map[string]*decodedBatch{}
	}
	w.decoded[resp.LeaseID] = d
	w.rmu.Unlock()
	go func() {
		defer close(d.done)
		items, parts := w.group(resp.Delivered)
		if bufs, err := w.decodeInto(ctx, items, parts, w.takeBufs()); err == nil {
			d.items, d.parts, d.bufs, d.ok = items, parts, bufs, true
		}
	}()
}

// takeDecoded is what predecode made of the batch, once it is done, or
// nil.
func (w *worker) takeDecoded(resp *broker.PopResponse) *decodedBatch {
	w.rmu.Lock()
	d := w.decoded[resp.LeaseID]
	delete(w.decoded, resp.LeaseID)
	w.rmu.Unlock()
	if d == nil {
		return nil
	}
	<-d.done
	if !d.ok {
		return nil
	}
	return d
}

// renewer extends a batch's lease while the batch runs.
type renewer struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	gone   bool
}

func newRenewer(ctx context.Context, s *sink, leaseID string) *renewer {
	ctx, cancel := context.WithCancel(ctx)
	r := &renewer{cancel: cancel, done: make(chan struct{})}
	every := time.Duration(s.spec.LeaseSeconds) * time.Second / 3
	go func() {
		defer close(r.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			out, err := s.env.Broker.ExtendLease(ctx, s.env.Tenant, leaseID, int64(s.spec.LeaseSeconds))
			if err != nil {
				continue // the next tick tries again
			}
			if !out.Success {
				r.mu.Lock()
				r.gone = true
				r.mu.Unlock()
				return
			}
		}
	}()
	return r
}

func (r *renewer) lost() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gone
}

func (r *renewer) stop() {
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}
