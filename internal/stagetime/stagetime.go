package stagetime

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

var (
	on   atomic.Bool
	sink atomic.Pointer[func(*Trace)]
	base = time.Now()
)

// On reports whether stages are being timed.
func On() bool { return on.Load() }

// Enable switches timing on; every finished request's Trace is handed to
// fn (on the request's goroutine). It forgets the entries and intervals of
// an earlier run.
func Enable(fn func(*Trace)) {
	reg.mu.Lock()
	reg.byKey = map[uintptr]*Entry{}
	reg.byIndex = map[uint64]*Entry{}
	reg.stores, reg.applies = nil, nil
	reg.mu.Unlock()
	sink.Store(&fn)
	on.Store(true)
}

// Disable switches timing off.
func Disable() {
	on.Store(false)
	sink.Store(nil)
}

// Stamp is a point on a request's path: the wall clock (ns since the
// package loaded) and the thread's CPU clock (ns, -1 when unknown) and id.
type Stamp struct {
	Wall int64
	CPU  int64
	TID  int32
}

// Now stamps the current point on the calling thread.
func Now() Stamp {
	cpu, tid := threadCPU()
	return Stamp{Wall: int64(time.Since(base)), CPU: cpu, TID: tid}
}

// wallNow stamps the wall clock only (another goroutine's point).
func wallNow() Stamp { return Stamp{Wall: int64(time.Since(base)), CPU: -1} }

// Set reports whether the stamp was taken.
func (s Stamp) Set() bool { return s.Wall != 0 }

// Span is the interval from a to b: its wall time, and its CPU time when
// both stamps were taken on the same thread (ok).
func Span(a, b Stamp) (wall, cpu time.Duration, ok bool) {
	wall = time.Duration(b.Wall - a.Wall)
	if a.CPU >= 0 && b.CPU >= 0 && a.TID != 0 && a.TID == b.TID {
		return wall, time.Duration(b.CPU - a.CPU), true
	}
	return wall, 0, false
}

// Mark names a point of a request on its own goroutine (and Proposed, on
// the ready loop's).
type Mark int

const (
	Start     Mark = iota // the handler is entered
	Decoded               // the body is read and decoded (the query parsed)
	Validated             // the broker has checked the input and built the command
	Queued                // the command is queued for proposal on the leader
	Proposed              // the ready loop took it into an entry (wall clock only)
	Result                // the handler has the broker's result
	Written               // the reply is written
	Woken                 // a long-polling pop was last woken to look again
	NumMarks
)

// Trace is one request's stamps.
type Trace struct {
	Kind  string
	At    [NumMarks]Stamp
	Entry *Entry // the last log entry its command joined (nil: none, e.g. forwarded)
	// Tag names what the request produced, for a benchmark to match the
	// trace with what its client saw (a pop's first message id).
	Tag string
}

// Wall is t on the stamps' wall clock (ns since the package loaded), for
// a client in the same process to place its own times among the stamps.
func Wall(t time.Time) int64 { return int64(t.Sub(base)) }

// Begin starts timing a request of the given kind; nil when timing is off.
func Begin(kind string) *Trace {
	if !on.Load() {
		return nil
	}
	t := &Trace{Kind: kind}
	t.At[Start] = Now()
	return t
}

// Mark stamps m now, on the calling thread.
func (t *Trace) Mark(m Mark) {
	if t == nil {
		return
	}
	t.At[m] = Now()
}

// Finish stamps Written and hands the trace to the sink.
func (t *Trace) Finish() {
	if t == nil {
		return
	}
	t.At[Written] = Now()
	if fn := sink.Load(); fn != nil && on.Load() {
		(*fn)(t)
	}
}

type ctxKey struct{}

// With returns ctx carrying t (ctx itself when t is nil).
func With(ctx context.Context, t *Trace) context.Context {
	if t == nil {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, t)
}

// From returns the trace ctx carries; nil when timing is off.
func From(ctx context.Context) *Trace {
	if !on.Load() {
		return nil
	}
	t, _ := ctx.Value(ctxKey{}).(*Trace)
	return t
}

// EntryMark names a point of a raft log entry on the leader.
type EntryMark int

const (
	Encode     EntryMark = iota // the ready loop starts encoding the entry
	Handed                      // encoded: the entry goes to raft (Propose)
	StoreStart                  // the append thread starts writing it to the log
	StoreEnd                    // the log write (and fsync) returned
	ApplyStart                  // the state machine starts applying the batch holding it
	ApplyEnd                    // the state machine's apply of that batch returned
	Returned                    // the apply thread answered the entry's proposers
	NumEntryMarks
)

// Write is one follower's log write of an entry.
type Write struct {
	Node       string
	Start, End Stamp
}

// Entry is one raft log entry's stamps, shared by the requests in it.
type Entry struct {
	mu        sync.Mutex
	index     uint64
	cmds      int
	at        [NumEntryMarks]Stamp
	followers []Write
	applied   int // entries in the state machine's batch that held it
}

// EntryView is a copy of an Entry's stamps.
type EntryView struct {
	Index     uint64
	Cmds      int
	At        [NumEntryMarks]Stamp
	Followers []Write
	Batch     int // entries in the state machine's batch that held it
}

// View copies the entry's stamps.
func (e *Entry) View() EntryView {
	e.mu.Lock()
	defer e.mu.Unlock()
	return EntryView{Index: e.index, Cmds: e.cmds, At: e.at, Followers: append([]Write(nil), e.followers...), Batch: e.applied}
}

// NewEntry starts the stamps of an entry grouping the given requests
// (whose Proposed it stamps); nil when timing is off.
func NewEntry(traces []*Trace) *Entry {
	if !on.Load() {
		return nil
	}
	e := &Entry{cmds: len(traces)}
	now := wallNow()
	for _, t := range traces {
		if t != nil {
			t.At[Proposed] = now
			t.Entry = e
		}
	}
	return e
}

// Mark stamps m now, on the calling thread.
func (e *Entry) Mark(m EntryMark) {
	if e == nil {
		return
	}
	s := Now()
	e.mu.Lock()
	e.at[m] = s
	e.mu.Unlock()
}

// Register names the entry by the address of its log data, which the
// leader's log write and apply see again.
func (e *Entry) Register(key uintptr) {
	if e == nil {
		return
	}
	reg.mu.Lock()
	reg.byKey[key] = e
	reg.mu.Unlock()
}

// Interval is a span of wall time on one goroutine of the leader.
type Interval struct{ Start, End int64 }

const maxIntervals = 1 << 20

var reg struct {
	mu      sync.Mutex
	byKey   map[uintptr]*Entry
	byIndex map[uint64]*Entry
	stores  []Interval // the leader's log writes
	applies []Interval // the leader's state machine applies
}

// LogRef is one log entry seen by a log write or an apply: its index and
// the address of its data.
type LogRef struct {
	Index uint64
	Key   uintptr
}

// Indexed tells the leader's entries their log indexes before they are
// written anywhere, so that a follower's write that ends before the
// leader's is found by its index.
func Indexed(refs []LogRef) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for _, r := range refs {
		e := reg.byKey[r.Key]
		if e == nil {
			continue
		}
		e.mu.Lock()
		e.index = r.Index
		e.mu.Unlock()
		reg.byIndex[r.Index] = e
	}
}

// Stored records a log write of refs from start to end. On the leader the
// entries are found by key; on a follower (node) by index.
func Stored(leader bool, node string, refs []LogRef, start, end Stamp) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if leader {
		if len(reg.stores) < maxIntervals {
			reg.stores = append(reg.stores, Interval{start.Wall, end.Wall})
		}
		for _, r := range refs {
			e := reg.byKey[r.Key]
			if e == nil {
				continue
			}
			e.mu.Lock()
			e.index = r.Index
			e.at[StoreStart], e.at[StoreEnd] = start, end
			e.mu.Unlock()
			reg.byIndex[r.Index] = e
			if len(reg.byIndex) > 8192 {
				for i := range reg.byIndex {
					if i+4096 < r.Index {
						delete(reg.byIndex, i)
					}
				}
			}
		}
		return
	}
	for _, r := range refs {
		if e := reg.byIndex[r.Index]; e != nil {
			e.mu.Lock()
			e.followers = append(e.followers, Write{Node: node, Start: start, End: end})
			e.mu.Unlock()
		}
	}
}

// Applied records the leader's state machine applying refs (one batch)
// from start to end. Entries not proposed with stamps (and every entry on
// a follower, whose data is its own copy) are not found and ignored.
func Applied(refs []LogRef, start, end Stamp) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	found := false
	for _, r := range refs {
		e := reg.byKey[r.Key]
		if e == nil {
			continue
		}
		found = true
		delete(reg.byKey, r.Key)
		e.mu.Lock()
		e.at[ApplyStart], e.at[ApplyEnd] = start, end
		e.applied = len(refs)
		e.mu.Unlock()
	}
	if found && len(reg.applies) < maxIntervals {
		reg.applies = append(reg.applies, Interval{start.Wall, end.Wall})
	}
}

// Intervals returns the leader's log writes and state machine applies
// recorded since Enable, in order.
func Intervals() (stores, applies []Interval) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	return append([]Interval(nil), reg.stores...), append([]Interval(nil), reg.applies...)
}
