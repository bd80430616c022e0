package state

import (
	"hash/maphash"
)

// nameFilter is a bloom filter over the partition names of one queue (the
// hashes of their name keys). A name it does not hold has no partition, so
// looking the name up needs no read:
// a snapshot pushes one message per row key, and almost every name is new.
// It holds every name stored in the batch's view (it is built by scanning
// the queue's names, and createPart adds to it); names of deleted
// partitions may linger, which costs only a read. It is derived state in
// the record cache: it never changes a result, only spares reads.
type nameFilter struct {
	bits  []uint64
	n, at int // names added; capacity before a rebuild
}

// Bits per name and probes per lookup: about 1% false positives.
const (
	nameFilterBitsPerName = 10
	nameFilterProbes      = 7
	// Queues with more partitions get no filter: building one reads every
	// name of the queue once.
	maxFilteredPartitions = 4 << 20
)

var nameFilterSeed = maphash.MakeSeed()

func newNameFilter(capacity int) *nameFilter {
	capacity = max(capacity, 1024)
	words := (capacity*nameFilterBitsPerName + 511) / 512 * 8
	return &nameFilter{bits: make([]uint64, words), at: capacity}
}

func nameHash(name []byte) uint64 { return maphash.Bytes(nameFilterSeed, name) }

func (f *nameFilter) set(h uint64) { f.probe(h, true); f.n++ }

// probe tests (or sets) a name's bits. They lie in one 512-bit block, a
// cache line, chosen by the hash's high half: a lookup of a new name costs
// one cache miss, not one per probe.
func (f *nameFilter) probe(h uint64, set bool) bool {
	blocks := uint64(len(f.bits) / 8)
	base := ((h >> 32) * blocks >> 32) * 8
	h2 := h * 0x9E3779B97F4A7C15
	for i := 0; i < nameFilterProbes; i++ {
		b := (h2 >> (9 * i)) & 511
		w, bit := base+b/64, uint64(1)<<(b%64)
		if set {
			f.bits[w] |= bit
		} else if f.bits[w]&bit == 0 {
			return false
		}
	}
	return true
}

// block loads the first word of the block that h's bits lie in (probeNames).
func (f *nameFilter) block(h uint64) uint64 {
	blocks := uint64(len(f.bits) / 8)
	return f.bits[((h>>32)*blocks>>32)*8]
}

// mayHold is false only for a name key hash h that was never added.
func (f *nameFilter) mayHold(h uint64) bool { return f.probe(h, false) }

// full reports whether the filter holds more names than it was sized for.
func (f *nameFilter) full() bool { return f.n > f.at }

// partNames returns the name filter of a queue, building it from the
// batch's view of the queue's partition names on first use; nil when the
// queue is too large to have one.
func (ac *applyCtx) partNames(tid uint32, q *queueRec) *nameFilter {
	ref := queueRef{tid, q.ID}
	if ac.lastFilter.ok && ac.lastFilter.ref == ref {
		return ac.lastFilter.f
	}
	if f, ok := ac.filters[ref]; ok {
		ac.lastFilter = filterMemo{ref, f, true}
		return f
	}
	if q.Partitions > maxFilteredPartitions {
		return nil
	}
	prefix := partNamePrefix(tid, q.ID)
	it := ac.iter(prefix)
	if it == nil {
		return nil
	}
	var hashes []uint64
	for ok := it.First(); ok; ok = it.Next() {
		hashes = append(hashes, nameHash(it.Key()))
	}
	ac.closeIter(it)
	if ac.err != nil {
		return nil
	}
	f := newNameFilter(2 * len(hashes))
	for _, h := range hashes {
		f.set(h)
	}
	ac.filters[ref] = f
	ac.lastFilter = filterMemo{ref, f, true}
	return f
}

// notePartName adds a new partition's name key hash h to its queue's
// filter, if the queue has one; a filter past its size is dropped and
// rebuilt when next needed.
func (ac *applyCtx) notePartName(tid uint32, qid uint64, h uint64) {
	ref := queueRef{tid, qid}
	f := ac.lastFilter.f
	if !ac.lastFilter.ok || ac.lastFilter.ref != ref {
		if f = ac.filters[ref]; f == nil {
			return
		}
	}
	f.set(h)
	if f.full() {
		ac.dropFilter(ref)
	}
}

// dropFilter forgets queue ref's filter.
func (ac *applyCtx) dropFilter(ref queueRef) {
	delete(ac.filters, ref)
	if ac.lastFilter.ref == ref {
		ac.lastFilter = filterMemo{}
	}
}

// filterMemo is the last filter looked up (a queue's pushes come in runs),
// which spares hashing the queue's reference for every name; ok: f is the
// filter of ref.
type filterMemo struct {
	ref queueRef
	f   *nameFilter
	ok  bool
}

// queueRef names a queue by tenant and id.
type queueRef struct {
	tid uint32
	qid uint64
}
