package pgsink

import (
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// A batch whose partitions' offsets the sink knows from its own last
// commits on them takes one round trip: one message that is one implicit
// transaction (a simple query of several statements commits as one), its
// first statement moving the batch's progress rows from the offsets the
// sink knows to the new ones (an UPDATE that takes only rows still holding
// the known offset, and so locks and checks them in the same pass), then
// the rows. When a row holds another offset (another node or an expired
// lease moved it, a crash lost a commit, someone deleted it) the
// statement fails the transaction before anything is written, and the
// batch is done the careful way: lock and read the offsets, then write.
// Either way the offsets a batch skips by are the ones locked in its own
// transaction.

// maxKnown bounds the offsets a sink remembers; past it they are forgotten
// and learnt again.
const maxKnown = 1 << 16

// knownOffsets is the last offset this node's sink committed per
// partition, shared by its workers.
type knownOffsets struct {
	mu sync.Mutex
	m  map[uint64]int64
}

// fill sets every partition's last offset from what is known and says
// whether all were known.
func (k *knownOffsets) fill(parts []*partWork) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range parts {
		off, ok := k.m[p.pid]
		if !ok {
			return false
		}
		p.last = off
	}
	return true
}

// learn records the partitions' offsets after a commit: each partition's
// highest resolved offset (tops), or its last one where none moved.
func (k *knownOffsets) learn(parts []*partWork, applied func(p *partWork, i int) bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil || len(k.m) >= maxKnown {
		k.m = make(map[uint64]int64, len(parts))
	}
	for _, p := range parts {
		k.m[p.pid] = top(p, applied)
	}
}

// forget drops the partitions' offsets: a commit's outcome is unknown.
func (k *knownOffsets) forget(parts []*partWork) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range parts {
		delete(k.m, p.pid)
	}
}

// top is the highest offset of p resolved once the batch commits: every
// message up to it applied, now or before.
func top(p *partWork, applied func(p *partWork, i int) bool) int64 {
	t := p.last
	for i, it := range p.items {
		if it.state == stSkipped {
			continue
		}
		if !applied(p, i) {
			break
		}
		t = max(t, int64(it.m.Offset))
	}
	return t
}

// stmtAdvance moves the progress rows of partitions $2 (bigint[]) that
// hold their known offsets $3 to the new ones $4, and fails, with
// movedSentinel in its error, unless every one did. The UPDATE locks each
// row it takes, so the check and the move are one pass over the rows; a
// row another transaction holds is waited for and then checked as that
// one left it (and not taken if it moved). The text cast fails at run
// time only: count(*) is not a constant the planner could fold. Two
// sessions on the same partitions (a lease that ran out) may lock them in
// different orders: PostgreSQL then fails one with a deadlock, a
// transient error the batch is retried after.
const stmtAdvance = "queen_sink_advance"

const movedSentinel = "queen-sink: a progress row moved"

func advanceSQL(pt string) string {
	return `WITH u AS (UPDATE ` + pt + ` AS x SET last_offset = v.n, updated_at = now()
		FROM unnest($2::text::bigint[], $3::text::bigint[], $4::text::bigint[]) AS v(p, o, n)
		WHERE x.sink = $1 AND x.partition_id = v.p AND x.last_offset = v.o RETURNING 1)
	SELECT CASE WHEN count(*) = cardinality($2::text::bigint[]) THEN 0
		ELSE ('` + movedSentinel + ` ' || count(*))::int END FROM u`
}

// errMoved says the check found a progress row moved and rolled back.
var errMoved = errors.New("a progress row moved")

// progressMoved says err is the check's failure.
func progressMoved(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22P02" && strings.Contains(pe.Message, movedSentinel)
}

// advanceArgs are the advance's arrays: every partition of the batch,
// its known offset, and its new one, the highest resolved once the batch
// commits (the known one where none moves).
func advanceArgs(parts []*partWork, applied func(p *partWork, i int) bool) (pids, known, next []byte) {
	pids = make([]byte, 0, 8*len(parts)+2)
	known = make([]byte, 0, 8*len(parts)+2)
	next = make([]byte, 0, 8*len(parts)+2)
	pids, known, next = append(pids, '{'), append(known, '{'), append(next, '{')
	for i, p := range parts {
		if i > 0 {
			pids, known, next = append(pids, ','), append(known, ','), append(next, ',')
		}
		pids = strconv.AppendUint(pids, p.pid, 10)
		known = strconv.AppendInt(known, p.last, 10)
		next = strconv.AppendInt(next, top(p, applied), 10)
	}
	return append(pids, '}'), append(known, '}'), append(next, '}')
}

// leadSQL is the start of a one-round-trip batch's simple query: the
// advance, with no BEGIN (the message is one implicit transaction) and no
// SET LOCAL (the connection commits without a flush by default,
// prepareProgress).
func (w *worker) leadSQL(parts []*partWork, applied func(p *partWork, i int) bool) string {
	pids, known, next := advanceArgs(parts, applied)
	return "EXECUTE " + stmtAdvance + "(" + w.nameLit + ", '" + string(pids) + "', '" + string(known) + "', '" + string(next) + "'); "
}

// queueLead adds the start of a one-round-trip batch to a pipeline.
func (w *worker) queueLead(b *pgconn.Batch, parts []*partWork, applied func(p *partWork, i int) bool) {
	pids, known, next := advanceArgs(parts, applied)
	b.ExecParams("BEGIN", nil, nil, nil, nil)
	b.ExecPrepared(stmtAdvance, [][]byte{[]byte(w.s.name), pids, known, next}, nil, nil)
}
