package state

import (
	"github.com/google/btree"
)

// recordCache holds decoded records by their Pebble key. A nil value caches
// "absent". It is derived state: dropping it changes nothing but speed.
type recordCache struct {
	tenants    map[string]uint32
	queueNames map[string]uint64
	queues     map[string]*queueRec
	partIDs    map[string]uint64 // partition-name key -> id (0 = absent)
	partLocs   map[uint64]partLoc
	parts      map[string]*partRec
	subs       map[string]*subRec
	subLists   map[string][]string
	cursors    map[string]*cursorRec
	ready      map[subRef]*readySet
	filters    map[queueRef]*nameFilter
}

// subRef names a subscription by tenant and id.
type subRef struct {
	tid uint32
	sub uint64
}

// readySet mirrors one subscription's part of the ready index (the tReady
// keys) in memory, ordered by partition id. Pop walks it instead of a
// Pebble iterator: ready keys are set and deleted at every lease, so the
// memtable holds many versions of each and an iterator has to step over
// all of them. The keys stay in Pebble (they are state, and a restart or a
// snapshot rebuilds the mirror from them); the mirror is loaded on first
// use and updated wherever a ready key is written.
type readySet = btree.BTreeG[uint64]

func newReadySet() *readySet {
	return btree.NewG[uint64](32, func(a, b uint64) bool { return a < b })
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
	trim(c.parts)
	trim(c.subs)
	trim(c.cursors)
	if len(c.ready) > 10_000 {
		clear(c.ready)
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
		partIDs:    map[string]uint64{},
		partLocs:   map[uint64]partLoc{},
		parts:      map[string]*partRec{},
		subs:       map[string]*subRec{},
		subLists:   map[string][]string{},
		cursors:    map[string]*cursorRec{},
		ready:      map[subRef]*readySet{},
		filters:    map[queueRef]*nameFilter{},
	}
}
