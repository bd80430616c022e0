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
	partIDs    map[uint64]uint64 // hash of a partition-name key -> id (partIDIn)
	partLocs   map[uint64]partLoc
	locRuns    *locRuns
	parts      map[uint64]*partRec // by partition id (partRec.tid, .Queue say whose)
	subs       map[string]*subRec
	subLists   map[string][]string
	cursors    map[string]*cursorRec
	ready      map[subRef]*readySet
	readyReads map[subRef]int // ready keys read one by one, per group without a mirror
	filters    map[queueRef]*nameFilter
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
	trim(c.partIDs)
	trim(c.partLocs)
	c.locRuns.trim()
	trim(c.parts)
	trim(c.subs)
	trim(c.cursors)
	if len(c.ready) > 10_000 {
		clear(c.ready)
	}
	if len(c.readyReads) > 10_000 {
		clear(c.readyReads)
	}
	if len(c.filters) > 10_000 {
		clear(c.filters)
	}
	if len(c.subLists) > maxCachedPerMap {
		clear(c.subLists)
	}
}

func newRecordCache() *recordCache {
	return &recordCache{
		tenants:    map[string]uint32{},
		queueNames: map[string]uint64{},
		queues:     map[string]*queueRec{},
		partIDs:    map[uint64]uint64{},
		partLocs:   map[uint64]partLoc{},
		locRuns:    &locRuns{},
		parts:      map[uint64]*partRec{},
		subs:       map[string]*subRec{},
		subLists:   map[string][]string{},
		cursors:    map[string]*cursorRec{},
		ready:      map[subRef]*readySet{},
		readyReads: map[subRef]int{},
		filters:    map[queueRef]*nameFilter{},
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
