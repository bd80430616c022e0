package state

import (
	"slices"
	"sort"
)

// recordCache holds decoded records by their Pebble key. A nil value caches
// "absent". It is derived state: dropping it changes nothing but speed.
type recordCache struct {
	tenants    map[string]uint32
	queueNames map[string]uint64
	queues     map[string]*queueRec
	partIDs    *nameIndex // hash of a partition-name key -> id (partIDIn)
	partLocs   map[uint64]partLoc
	locRuns    *locRuns
	parts      *partCache // by partition id (partRec.tid, .Queue say whose)
	subs       map[string]*subRec
	subLists   map[string][]string
	cursors    map[cursorRef]*cursorRec
	settled    *settledSet // see settledCur; never also in cursors
	ready      map[subRef]*readySet
	readyReads map[subRef]int // ready keys read one by one, per group without a mirror
	filters    map[queueRef]*nameFilter
	leases     map[leaseRef]*leaseRec
	// leaseSweepAt: past this many entries, trim drops the ended leases'
	// "absent" entries from leases (sweepLeases).
	leaseSweepAt int
	// leaseIdx is complete once loaded, and never trimmed: it holds one
	// entry per leased partition in flight (lease_overlay.go).
	leaseIdx *overlayIndex
}

// subRef names a subscription by tenant and id.
type subRef struct {
	tid uint32
	sub uint64
}

// maxCachedPerMap bounds each map of the cache; past it a random tenth of
// the map is dropped (a cache only: nothing depends on what it holds).
const maxCachedPerMap = 1_000_000

func trim[K comparable, V any](m map[K]V) {
	if len(m) <= maxCachedPerMap {
		return
	}
	drop := len(m) / 10
	for k := range m {
		if drop == 0 {
			return
		}
		delete(m, k)
		drop--
	}
}

// trim bounds the cache. It runs between batches, when nothing is dirty.
func (c *recordCache) trim() {
	trim(c.tenants)
	trim(c.queueNames)
	trim(c.queues)
	c.partIDs.trim()
	trim(c.partLocs)
	c.locRuns.trim()
	c.parts.trim()
	trim(c.subs)
	trim(c.cursors)
	c.settled.trim()
	if len(c.ready) > 10_000 {
		clear(c.ready)
	}
	if len(c.readyReads) > 10_000 {
		clear(c.readyReads)
	}
	if len(c.filters) > 10_000 {
		clear(c.filters)
	}
	c.sweepLeases()
	if len(c.leases) > 100_000 {
		clear(c.leases)
	}
	if len(c.subLists) > maxCachedPerMap {
		clear(c.subLists)
	}
}

// minLeaseSweep is the fewest entries of the lease records' map that a
// sweep waits for.
const minLeaseSweep = 4096

// sweepLeases drops the "absent" entries of ended leases. A lease ends as
// an absent entry (endLeaseRecord) and every pop takes a new lease id, so
// without the sweep they would fill the map up to its bound, and a Go map
// keeps the room it grew to. It sweeps when the map has doubled since the
// last sweep, so a lease costs it O(1) on average.
func (c *recordCache) sweepLeases() {
	if len(c.leases) <= max(c.leaseSweepAt, minLeaseSweep) {
		return
	}
	for k, r := range c.leases {
		if r == nil {
			delete(c.leases, k)
		}
	}
	c.leaseSweepAt = 2 * len(c.leases)
}

func newRecordCache() *recordCache {
	return &recordCache{
		tenants:    map[string]uint32{},
		queueNames: map[string]uint64{},
		queues:     map[string]*queueRec{},
		partIDs:    newNameIndex(),
		partLocs:   map[uint64]partLoc{},
		locRuns:    &locRuns{},
		parts:      newPartCache(),
		subs:       map[string]*subRec{},
		subLists:   map[string][]string{},
		cursors:    map[cursorRef]*cursorRec{},
		settled:    newSettledSet(),
		ready:      map[subRef]*readySet{},
		readyReads: map[subRef]int{},
		filters:    map[queueRef]*nameFilter{},
		leases:     map[leaseRef]*leaseRec{},
		leaseIdx:   &overlayIndex{m: map[cursorRef]*leaseOverlay{}},
	}
}

// locRun is a run of consecutive partition ids of one queue, created by one
// command, and described by one locator key (see noteLocator).
type locRun struct {
	tid         uint32
	qid         uint64
	first, last uint64 // last == 0: none
}

// locRuns caches the locator runs this store created, in id order (ids are
// allocated in increasing order, so new runs come last).
type locRuns struct{ runs []locRun }

// maxCachedRuns bounds the runs kept; past it the older half is dropped.
const maxCachedRuns = 1 << 18

func (l *locRuns) add(r locRun) {
	if n := len(l.runs); n > 0 && l.runs[n-1].last >= r.first {
		return // not in order: leave it to the locator keys
	}
	l.runs = append(l.runs, r)
}

// find returns the run holding partition id pid.
func (l *locRuns) find(pid uint64) (locRun, bool) {
	i := sort.Search(len(l.runs), func(i int) bool { return l.runs[i].last >= pid })
	if i < len(l.runs) && l.runs[i].first <= pid {
		return l.runs[i], true
	}
	return locRun{}, false
}

// dropQueue forgets the runs of a deleted queue.
func (l *locRuns) dropQueue(tid uint32, qid uint64) {
	l.runs = slices.DeleteFunc(l.runs, func(r locRun) bool { return r.tid == tid && r.qid == qid })
}

func (l *locRuns) trim() {
	if len(l.runs) > maxCachedRuns {
		l.runs = append([]locRun(nil), l.runs[len(l.runs)/2:]...)
	}
}

// partCache holds partition records by id (nil: absent). The partitions
// this store creates get consecutive ids from one counter, so they go into
// a window indexed by id (an append, where a map insert into a cache of
// many partitions costs a cache miss and, now and then, a rehash), with
// their records allocated in slabs; records read from Pebble, and "absent",
// go into a map.
type partCache struct {
	m    map[uint64]*partRec
	base uint64     // id of win[0]
	win  []*partRec // nil: not in the window (see m)
	n    int        // non-nil entries of win
	slab []partRec
}

// maxWindowGap is the widest run of ids a new partition may skip and still
// extend the window (filled with nils); past it the window starts again.
const maxWindowGap = 1024

// partSlab is how many records one slab holds.
const partSlab = 256

func newPartCache() *partCache { return &partCache{m: map[uint64]*partRec{}} }

func (c *partCache) inWin(pid uint64) bool { return pid >= c.base && pid-c.base < uint64(len(c.win)) }

// get returns the cached record of pid; ok is false when pid is not cached.
func (c *partCache) get(pid uint64) (p *partRec, ok bool) {
	if c.inWin(pid) {
		if p = c.win[pid-c.base]; p != nil {
			return p, true
		}
	}
	p, ok = c.m[pid]
	return p, ok
}

// peek returns the record of pid when the window holds it (probeNames),
// without the map.
func (c *partCache) peek(pid uint64) *partRec {
	if c.inWin(pid) {
		return c.win[pid-c.base]
	}
	return nil
}

// put caches p (nil: absent) as partition pid's record.
func (c *partCache) put(pid uint64, p *partRec) {
	if p != nil && c.inWin(pid) {
		if c.win[pid-c.base] == nil {
			c.n++
		}
		c.win[pid-c.base] = p
		if len(c.m) > 0 {
			delete(c.m, pid)
		}
		return
	}
	if c.inWin(pid) && c.win[pid-c.base] != nil {
		c.win[pid-c.base] = nil
		c.n--
	}
	c.m[pid] = p
}

// newRec returns a zeroed record for a partition being created.
func (c *partCache) newRec() *partRec {
	if len(c.slab) == 0 {
		c.slab = make([]partRec, partSlab)
	}
	p := &c.slab[0]
	c.slab = c.slab[1:]
	return p
}

// putNew caches the record of a partition this store just created: its
// id is above every id cached so far.
func (c *partCache) putNew(pid uint64, p *partRec) {
	end := c.base + uint64(len(c.win))
	switch {
	case len(c.win) > 0 && pid >= end && pid-end <= maxWindowGap:
		for ; end < pid; end++ {
			c.win = append(c.win, nil)
		}
	case !c.inWin(pid):
		// Start the window again at pid; what it held moves to the map.
		for i, q := range c.win {
			if q != nil {
				c.m[c.base+uint64(i)] = q
			}
		}
		c.base, c.win, c.n = pid, nil, 0
	}
	if c.inWin(pid) {
		c.put(pid, p)
		return
	}
	c.win = append(c.win, p)
	c.n++
	if len(c.m) > 0 {
		delete(c.m, pid)
	}
}

// del forgets partition pid.
func (c *partCache) del(pid uint64) {
	if c.inWin(pid) && c.win[pid-c.base] != nil {
		c.win[pid-c.base] = nil
		c.n--
	}
	delete(c.m, pid)
}

func (c *partCache) len() int { return c.n + len(c.m) }

// each calls f for every cached record (absent ones included, as nil).
func (c *partCache) each(f func(pid uint64, p *partRec)) {
	for i, p := range c.win {
		if p != nil {
			f(c.base+uint64(i), p)
		}
	}
	for pid, p := range c.m {
		f(pid, p)
	}
}

// trim bounds the cache: the map as the other maps, the window by dropping
// its older half.
func (c *partCache) trim() {
	trim(c.m)
	if len(c.win) > maxCachedPerMap {
		half := len(c.win) / 2
		for _, p := range c.win[:half] {
			if p != nil {
				c.n--
			}
		}
		c.win = append([]*partRec(nil), c.win[half:]...)
		c.base += uint64(half)
	}
}

// nameIndex maps the hash of a partition-name key to a partition id
// (partIDIn confirms the name against the cached record). It is an
// open-addressing table with linear probing over one array of (hash, id)
// pairs: an insert or a lookup of a name not seen lately touches one cache
// line, where a Go map of a million entries touches its control word and
// its slot, usually two (a snapshot inserts one name per row). Hash 0 is
// stored as 1; a collision only costs the read that a miss costs.
type nameIndex struct {
	kv   []nameSlot
	n    int
	sink uint64 // the sums of touch and probeNames, kept so that their loads are not elided
}

type nameSlot struct{ h, id uint64 }

const nameIndexMin = 1024

func newNameIndex() *nameIndex { return &nameIndex{kv: make([]nameSlot, nameIndexMin)} }

func (x *nameIndex) len() int { return x.n }

// slot returns the index of h's slot, or of the empty slot where it goes.
func (x *nameIndex) slot(h uint64) int {
	mask := uint64(len(x.kv) - 1)
	i := h & mask
	for x.kv[i].h != 0 && x.kv[i].h != h {
		i = (i + 1) & mask
	}
	return int(i)
}

func (x *nameIndex) get(h uint64) (uint64, bool) {
	h = max(h, 1)
	e := x.kv[x.slot(h)]
	return e.id, e.h != 0
}

// home returns the id in h's home slot (0 if another name's or empty),
// loading the slot's line for the lookup that follows (probeNames).
func (x *nameIndex) home(h uint64) uint64 {
	e := x.kv[max(h, 1)&uint64(len(x.kv)-1)]
	if e.h != max(h, 1) {
		return 0
	}
	return e.id
}

func (x *nameIndex) put(h, id uint64) {
	h = max(h, 1)
	i := x.slot(h)
	if x.kv[i].h == 0 {
		// At most three quarters full, so that probes stay short.
		if (x.n+1)*4 > len(x.kv)*3 {
			x.resize(2*len(x.kv), 0)
			i = x.slot(h)
		}
		x.n++
	}
	x.kv[i] = nameSlot{h, id}
}

// grow makes room for n more entries without a resize.
func (x *nameIndex) grow(n int) {
	size := len(x.kv)
	for (x.n+n)*4 > size*3 {
		size *= 2
	}
	if size != len(x.kv) {
		x.resize(size, 0)
	}
}

// touch loads the home slot of each created partition's name hash in a loop
// of independent loads, so that their cache misses overlap; the puts that
// follow then find the lines in the cache.
func (x *nameIndex) touch(order []pushedPart) {
	mask := uint64(len(x.kv) - 1)
	var sum uint64
	for i := range order {
		if order[i].created {
			sum += x.kv[max(order[i].nameH, 1)&mask].h
		}
	}
	x.sink = sum
}

// resize moves the entries into a table of size slots (a power of two),
// leaving out every dropEvery-th one (0: none).
func (x *nameIndex) resize(size, dropEvery int) {
	old := x.kv
	x.kv, x.n = make([]nameSlot, size), 0
	k := 0
	for _, e := range old {
		if e.h == 0 {
			continue
		}
		if k++; dropEvery > 0 && k%dropEvery == 0 {
			continue
		}
		x.kv[x.slot(e.h)] = e
		x.n++
	}
}

// trim bounds the index as trim bounds the maps: past maxCachedPerMap
// entries, a tenth is dropped.
func (x *nameIndex) trim() {
	if x.n > maxCachedPerMap {
		x.resize(len(x.kv), 10)
	}
}
