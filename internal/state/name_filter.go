package state

import (
	"hash/maphash"
)

// nameFilter is a bloom filter over the partition names of one queue. A name
// it does not hold has no partition, so looking the name up needs no read:
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

func (f *nameFilter) add(name string) { f.set(maphash.String(nameFilterSeed, name)) }

// mayHold is false only for a name that was never added.
func (f *nameFilter) mayHold(name string) bool {
	return f.probe(maphash.String(nameFilterSeed, name), false)
}

// full reports whether the filter holds more names than it was sized for.
func (f *nameFilter) full() bool { return f.n > f.at }

// partNames returns the name filter of a queue, building it from the
// batch's view of the queue's partition names on first use; nil when the
// queue is too large to have one.
func (ac *applyCtx) partNames(tid uint32, q *queueRec) *nameFilter {
	ref := queueRef{tid, q.ID}
	if f, ok := ac.filters[ref]; ok {
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
		hashes = append(hashes, nameHash(it.Key()[len(prefix):]))
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
	return f
}

// notePartName adds a new partition name to its queue's filter, if the
// queue has one; a filter past its size is dropped and rebuilt when next
// needed.
func (ac *applyCtx) notePartName(tid uint32, qid uint64, name string) {
	ref := queueRef{tid, qid}
	if f := ac.filters[ref]; f != nil {
		f.add(name)
		if f.full() {
			delete(ac.filters, ref)
		}
	}
}

// queueRef names a queue by tenant and id.
type queueRef struct {
	tid uint32
	qid uint64
}
