package state

// settledSet holds the settled cursors (settledCur) of every group: per
// group a window indexed by partition id, since a queue's partitions mostly
// have consecutive ids (one counter), and a map for the ids that fall far
// outside it. A window's entries are plain values, so neither holds a
// pointer for the collector to scan, and a lookup in a window is an index,
// not a hash probe: a pop's backfill asks for its partitions in id order,
// and a batch's flush settles its cursors in key order, so neighbouring
// lookups share cache lines.
type settledSet struct {
	wins map[subRef]*settledWin
	far  map[cursorRef]settledCur
	n    int // entries held (set)
	// last is the window looked up last (lastRef's; nil: none or absent):
	// a batch mostly asks for one group's cursors.
	lastRef subRef
	last    *settledWin
	// spare holds records of settled cursors, for unsettle to reuse with
	// their slices' capacity: a group popping from a few partitions again
	// and again would otherwise grow a new cursor's exceptions, leased
	// offsets and delivered ids from nothing at every pop.
	spare []*cursorRec
}

// maxSpare bounds the spare records kept, maxSpareCap the capacity of a
// slice a spare record keeps.
const (
	maxSpare    = 256
	maxSpareCap = 1024
)

// release keeps c, which nothing refers to any more, for reuse.
func (s *settledSet) release(c *cursorRec) {
	if len(s.spare) >= maxSpare || cap(c.Ex)+cap(c.LeaseOffs)+cap(c.recent) == 0 {
		return
	}
	if cap(c.Ex) > maxSpareCap || cap(c.LeaseOffs) > maxSpareCap || cap(c.recent) > maxSpareCap {
		return
	}
	clear(c.recent[:cap(c.recent)]) // no transaction ids kept alive
	s.spare = append(s.spare, c)
}

// record returns e as a cursor record, reusing a spare one if any.
func (s *settledSet) record(e settledCur) *cursorRec {
	c := &cursorRec{}
	if n := len(s.spare); n > 0 {
		c = s.spare[n-1]
		s.spare[n-1] = nil
		s.spare = s.spare[:n-1]
		*c = cursorRec{Ex: c.Ex[:0], LeaseOffs: c.LeaseOffs[:0], recent: c.recent[:0]}
	}
	c.Epoch, c.Cursor, c.Stamp, c.Ready, c.derived = e.epoch, e.cursor, e.stamp, e.ready, e.derived
	return c
}

// settledWin is one group's window: ents[i] is partition base+i's.
type settledWin struct {
	base uint64
	ents []settledCur
	n    int // entries set
}

// fits reports whether a window grown to size entries would stay dense
// enough: at least a quarter of it set, or small. Otherwise the cursor
// goes to the map, so that ids far apart cost no window between them.
func (w *settledWin) fits(size uint64) bool {
	return size <= 64 || uint64(w.n+1)*4 >= size
}

// maxSettled bounds the slots held (windows' entries, set or not, and the
// map's); past it the set is dropped whole (a cache only). A slot is 32
// bytes.
const maxSettled = 4 << 20

func newSettledSet() *settledSet {
	return &settledSet{wins: map[subRef]*settledWin{}, far: map[cursorRef]settledCur{}}
}

func (s *settledSet) win(ref cursorRef) *settledWin {
	k := subRef{uint32(ref.tid), ref.sub}
	if s.last == nil || s.lastRef != k {
		s.lastRef, s.last = k, s.wins[k]
	}
	return s.last
}

// get returns ref's settled cursor; ok is false when none is held.
func (s *settledSet) get(ref cursorRef) (settledCur, bool) {
	if w := s.win(ref); w != nil && ref.pid >= w.base && ref.pid-w.base < uint64(len(w.ents)) {
		if e := w.ents[ref.pid-w.base]; e.set {
			return e, true
		}
	}
	if len(s.far) == 0 {
		return settledCur{}, false
	}
	e, ok := s.far[ref]
	return e, ok
}

// put holds e as ref's settled cursor.
func (s *settledSet) put(ref cursorRef, e settledCur) {
	e.set = true
	w := s.win(ref)
	if w == nil {
		w = &settledWin{base: ref.pid}
		s.wins[s.lastRef] = w
		s.last = w
	}
	switch end := w.base + uint64(len(w.ents)); {
	case ref.pid >= w.base && ref.pid < end:
	case ref.pid >= end && w.fits(ref.pid-w.base+1):
		w.ents = append(w.ents, make([]settledCur, ref.pid-end+1)...)
	case ref.pid < w.base && w.fits(end-ref.pid):
		grown := make([]settledCur, uint64(len(w.ents))+w.base-ref.pid, cap(w.ents)+int(w.base-ref.pid))
		copy(grown[w.base-ref.pid:], w.ents)
		w.base, w.ents = ref.pid, grown
	default:
		if _, ok := s.far[ref]; !ok {
			s.n++
		}
		s.far[ref] = e
		return
	}
	if !w.ents[ref.pid-w.base].set {
		s.n++
		w.n++
		if len(s.far) > 0 {
			// The window may have grown over an id held in the map.
			s.delFar(ref)
		}
	}
	w.ents[ref.pid-w.base] = e
}

// del drops ref's settled cursor, if held.
func (s *settledSet) del(ref cursorRef) {
	if w := s.win(ref); w != nil && ref.pid >= w.base && ref.pid-w.base < uint64(len(w.ents)) {
		if e := &w.ents[ref.pid-w.base]; e.set {
			*e = settledCur{}
			s.n--
			w.n--
			return
		}
	}
	s.delFar(ref)
}

func (s *settledSet) delFar(ref cursorRef) {
	if _, ok := s.far[ref]; ok {
		delete(s.far, ref)
		s.n--
	}
}

// dropSub drops every settled cursor of group sub of tenant tid.
func (s *settledSet) dropSub(tid uint32, sub uint64) {
	if w := s.wins[subRef{tid, sub}]; w != nil {
		s.n -= w.n
		delete(s.wins, subRef{tid, sub})
	}
	s.last = nil
	for ref := range s.far {
		if ref.tid == uint64(tid) && ref.sub == sub {
			delete(s.far, ref)
			s.n--
		}
	}
}

func (s *settledSet) len() int { return s.n }

func (s *settledSet) trim() {
	slots := len(s.far)
	for _, w := range s.wins {
		slots += len(w.ents)
	}
	if slots > maxSettled {
		clear(s.wins)
		clear(s.far)
		s.n, s.last = 0, nil
		clear(s.spare)
		s.spare = s.spare[:0]
	}
}
