package pgsource

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/queen-mq/queen/internal/connector"
)

// recentXids is how many of the last transactions read from the stream
// the snapshotter remembers (see chunkWork.conflict).
const recentXids = 1 << 14

// snapshotter runs the watermark snapshot beside the stream
// (docs/design/source.md, "The watermark snapshot").
type snapshotter struct {
	r      *run
	prefix string
	// run makes this run's watermarks unique: a restarted source reads
	// the markers of the run before it again, and must not take them for
	// its own.
	run string
	n   int
	cur *chunkWork
	// finished: every table is copied.
	finished bool
	// notBefore delays the next chunk after one had to be read again.
	notBefore time.Time
	retries   int
	// recent xids, as a ring and a set.
	ring   [recentXids]uint32
	ringN  int
	recent map[uint32]int
	keybuf []byte
	row    tuple
	// arenaHint is how many bytes the last chunk's values took; spare is
	// the last chunk once its rows are pushed or dropped, whose buffers
	// the next chunk reuses.
	arenaHint int
	spare     *chunk
}

// chunkWork is the chunk in flight: read, waiting for its watermarks.
type chunkWork struct {
	id    string
	table *tableInfo
	rel   *relation
	chunk *chunk
	limit int
	// xip and xmax: what the chunk's snapshot did not see (the running
	// transactions, and every xid from xmax on).
	xip     []uint32
	xmax    uint32
	lowSeen bool
	// conflict: a transaction the stream delivered before the low
	// watermark was not visible to the chunk's read (its commit was
	// logged but not yet visible), so the chunk could be older than an
	// event already pushed. The chunk is read again.
	conflict bool
	// changed holds the keys changed between the watermarks; missing the
	// columns some of their updates left unchanged and none carried.
	changed map[string]struct{}
	missing map[string]map[int]bool
}

func newSnapshotter(r *run) *snapshotter {
	return &snapshotter{r: r, prefix: "queen:" + r.s.slot + ":wm", run: newEpoch(""), recent: map[uint32]int{}}
}

// pending reports whether any table still needs copying.
func (s *snapshotter) pending() bool {
	for _, t := range s.r.tables {
		if ts := s.r.pend.Snapshot.Tables[t.name]; ts != nil && !ts.Done {
			return true
		}
	}
	return false
}

// due reports how soon step has a chunk to read, when it is waiting to.
func (s *snapshotter) due() (time.Duration, bool) {
	if s.finished || s.cur != nil {
		return 0, false
	}
	return time.Until(s.notBefore), true
}

// xidSeen remembers a transaction the stream delivered.
func (s *snapshotter) xidSeen(xid uint32) {
	old := s.ring[s.ringN%recentXids]
	if s.ringN >= recentXids {
		if s.recent[old] <= 1 {
			delete(s.recent, old)
		} else {
			s.recent[old]--
		}
	}
	s.ring[s.ringN%recentXids] = xid
	s.ringN++
	s.recent[xid]++
}

// wants reports whether step has anything to do now (it may then query
// PostgreSQL).
func (s *snapshotter) wants() bool {
	return !s.finished && s.cur == nil && !s.r.cur.open && !time.Now().Before(s.notBefore)
}

// step reads the next chunk when none is in flight and a table needs it:
// low watermark, the chunk in one short REPEATABLE READ transaction (its
// snapshot's running transactions noted), high watermark, in one round
// trip (readWindow).
func (s *snapshotter) step(ctx context.Context) error {
	if !s.wants() {
		return nil
	}
	var t *tableInfo
	for _, ti := range s.r.tables {
		if ts := s.r.pend.Snapshot.Tables[ti.name]; ts != nil && !ts.Done {
			t = ti
			break
		}
	}
	if t == nil {
		if !s.r.pend.Snapshot.Done {
			s.r.pend.Snapshot.Done = true
			s.r.markDirty()
		}
		s.finished = true
		s.r.s.env.Status.SetPhase(connector.PhaseStreaming)
		return nil
	}
	rel, err := t.relation()
	if err != nil {
		return err
	}
	s.n++
	w := &chunkWork{id: s.run + ":" + strconv.Itoa(s.n), table: t, rel: rel, limit: s.r.s.spec.SnapshotChunkRows,
		changed: map[string]struct{}{}, missing: map[string]map[int]bool{}}
	if h := s.r.s.hooks; h != nil && h.beforeLow != nil {
		h.beforeLow(t.name)
	}
	high, err := s.readWindow(ctx, w, s.r.pend.Snapshot.Tables[t.name].LastKey)
	if err != nil {
		return err
	}
	s.arenaHint = len(w.chunk.arena)
	if h := s.r.s.hooks; h != nil && h.afterHigh != nil {
		lsn, _ := pglogrepl.ParseLSN(high)
		h.afterHigh(t.name, lsn)
	}
	s.cur = w
	return nil
}

// parseSnapshot reads "xmin:xmax:xip,..." into the running transactions
// and xmax, as 32-bit xids (what pgoutput's Begin carries).
func parseSnapshot(snap string) (xip []uint32, xmax uint32) {
	parts := strings.Split(snap, ":")
	if len(parts) != 3 {
		return nil, 0
	}
	if v, err := strconv.ParseUint(parts[1], 10, 64); err == nil {
		xmax = uint32(v)
	}
	if parts[2] == "" {
		return nil, xmax
	}
	for _, x := range strings.Split(parts[2], ",") {
		if v, err := strconv.ParseUint(x, 10, 64); err == nil {
			xip = append(xip, uint32(v))
		}
	}
	return xip, xmax
}

// key is the identity of a row's key in the window maps.
func (s *snapshotter) key(rel *relation, t *tuple) string {
	s.keybuf = s.keybuf[:0]
	for n, i := range rel.key {
		if n > 0 {
			s.keybuf = append(s.keybuf, '|')
		}
		s.keybuf = appendPartitionValue(s.keybuf, valueAt(t, i), !t.present(i), true)
	}
	return string(s.keybuf)
}

// observe notes a change of the chunk's table between the watermarks.
func (s *snapshotter) observe(rel *relation, c *change) {
	w := s.cur
	if w == nil || !w.lowSeen || rel.id != w.table.oid {
		return
	}
	if c.oldKind != 0 {
		k := s.key(rel, &c.old)
		w.changed[k] = struct{}{}
		if c.op == 'D' || !sameKey(rel, &c.old, &c.new) {
			delete(w.missing, k)
		}
	}
	if c.op == 'D' {
		return
	}
	k := s.key(rel, &c.new)
	w.changed[k] = struct{}{}
	if c.op == 'I' || (c.oldKind != 0 && !sameKey(rel, &c.old, &c.new)) {
		// An insert carries every column; a moved row's c is complete.
		delete(w.missing, k)
		return
	}
	m := w.missing[k]
	if m == nil {
		m = map[int]bool{}
		w.missing[k] = m
	}
	for i := range c.new.kind {
		switch c.new.kind[i] {
		case colUnchanged:
			if c.oldKind == 'O' {
				continue // REPLICA IDENTITY FULL fills it from the old row
			}
			if _, carried := m[i]; !carried {
				m[i] = true
			}
		default:
			m[i] = false // carried: the consumer has it
		}
	}
}

// watermark handles a marker of the snapshot.
func (s *snapshotter) watermark(ctx context.Context, m *pglogrepl.LogicalDecodingMessage) error {
	w := s.cur
	content := string(m.Content)
	if w == nil || len(content) < 2 || content[2:] != w.id {
		return nil // a marker from before a restart
	}
	switch content[0] {
	case 'L':
		w.lowSeen = true
		for _, x := range w.xip {
			if s.recent[x] > 0 {
				w.conflict = true
			}
		}
		// A transaction at or past xmax was not visible either (xids
		// compare modulo 2^32).
		for x := range s.recent {
			if int32(x-w.xmax) >= 0 {
				w.conflict = true
			}
		}
		return nil
	case 'H':
		s.cur = nil
		// The events copy what they need of the rows.
		defer func() { s.spare = w.chunk }()
		if !w.lowSeen || w.conflict {
			if s.retries++; s.retries == 1 {
				s.r.s.log.Info("a transaction committed before the snapshot chunk was read was not yet visible to it (a commit waiting for a synchronous standby?); reading the chunk again until it is", "table", w.table.name)
			}
			s.notBefore = time.Now().Add(100 * time.Millisecond)
			return nil
		}
		s.retries = 0
		return s.push(ctx, w, m.LSN)
	}
	return nil
}

// push writes the chunk's rows at the high watermark's place in the
// stream: every row whose key did not change between the markers, and a
// fill for changed rows whose missing columns no event carried.
//
// high is where the marker's WAL record ends, which is where the next
// record may begin: the commit of a transaction that changed a chunk row
// after the read starts there, and its events carry that position. The
// rows' position (and the pointer's flushLsn) is therefore the marker
// record's last byte, high-1: after the commit position of every change
// before the marker, before that of every change after it, so per key
// (lsn, seq) keeps ascending.
func (s *snapshotter) push(ctx context.Context, w *chunkWork, high pglogrepl.LSN) error {
	r := s.r
	ch := w.chunk
	// r.pend is replaced by every flush: its table state is looked up
	// afresh each time.
	ts := func() *tableState { return r.pend.Snapshot.Tables[w.table.name] }
	pos := high - 1
	m := meta{lsn: append(appendLSN([]byte{'"'}, pos), '"'), ts: appendTS(nil, ch.read)}
	if pos > pglogrepl.LSN(r.pend.FlushLSN) {
		// Confirming it, or resuming the stream from it, skips the marker
		// and nothing after it.
		r.pend.FlushLSN = lsnJSON(pos)
	}
	r.markDirty()
	rows := ch.rows()
	pushed := 0
	// The pointer's lastKey is the key of the last row in the bundle: set
	// before each bundle is handed over and after the last row, not for
	// every row.
	for i := 0; i < rows; i++ {
		if r.b.len() > 0 && r.full(1, 0) {
			if i > 0 {
				ts().LastKey = ch.key(i - 1)
			}
			if err := r.flush(ctx); err != nil {
				return err
			}
		}
		ch.row(i, &s.row)
		if s.changedKey(w, &s.row) {
			k := string(s.keybuf)
			var cols []int
			for c, miss := range w.missing[k] {
				if miss {
					cols = append(cols, c)
				}
			}
			if len(cols) > 0 {
				sortInts(cols)
				r.enc.fillRow(&r.b, w.rel, &s.row, cols, &m, r.pend.Epoch, pos, i)
			}
		} else {
			r.enc.snapshotRow(&r.b, w.rel, &s.row, &m, r.pend.Epoch, pos, i)
			pushed++
		}
		r.markDirty()
	}
	if rows > 0 {
		ts().LastKey = ch.key(rows - 1)
	}
	if rows < w.limit {
		ts().Done = true
		ts().LastKey = nil
	}
	r.s.env.Metrics.SourceSnapshotRows.Add(float64(pushed))
	return r.flush(ctx)
}

// changedKey reports whether the row's key changed between the chunk's
// watermarks; its key is then in s.keybuf. Most chunks have no such key,
// and a lookup builds no string.
func (s *snapshotter) changedKey(w *chunkWork, row *tuple) bool {
	if len(w.changed) == 0 {
		return false
	}
	s.key(w.rel, row)
	_, changed := w.changed[string(s.keybuf)]
	return changed
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}
