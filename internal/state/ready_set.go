package state

import (
	"math/bits"
	"slices"
	"sort"
)

// readySet mirrors one subscription's part of the ready index (the tReady
// keys) in memory, ordered by partition id. Pop walks it instead of a
// Pebble iterator: ready keys are set and deleted at every lease, so the
// memtable holds many versions of each and an iterator has to step over
// all of them. The keys stay in Pebble (they are state, and a restart or a
// snapshot rebuilds the mirror from them); the mirror is loaded on first
// use and updated wherever a ready key is written.
//
// Ids are grouped in chunks of 2^16 consecutive ids. A chunk holds its ids'
// low 16 bits as a sorted list while it has few, and as a bitmap of 8 KiB
// once the list would be as large, so a million partitions whose ids are
// close together take about 128 KiB and no per-id heap object.
type readySet struct {
	chunks []readyChunk // ordered by hi
	n      int
}

type readyChunk struct {
	hi   uint64   // the ids' high bits (id >> 16)
	low  []uint16 // sorted low bits, when bits is nil
	bits []uint64 // 1024 words, one bit per low value, when dense
	n    int
}

const (
	readyChunkBits  = 16
	readyChunkWords = 1 << readyChunkBits / 64
	// A list of this many entries takes as much as a bitmap.
	readyChunkDense = 1 << readyChunkBits / 16
)

func newReadySet() *readySet { return &readySet{} }

// Len is the number of ids held.
func (r *readySet) Len() int { return r.n }

// chunk returns the index of the first chunk whose hi is at least hi.
func (r *readySet) chunk(hi uint64) int {
	return sort.Search(len(r.chunks), func(i int) bool { return r.chunks[i].hi >= hi })
}

// Has reports whether id is in the set.
func (r *readySet) Has(id uint64) bool {
	hi, lo := id>>readyChunkBits, uint16(id)
	i := r.chunk(hi)
	if i == len(r.chunks) || r.chunks[i].hi != hi {
		return false
	}
	c := &r.chunks[i]
	if c.bits != nil {
		return c.bits[lo/64]&(1<<(lo%64)) != 0
	}
	_, ok := slices.BinarySearch(c.low, lo)
	return ok
}

// Insert adds id to the set.
func (r *readySet) Insert(id uint64) {
	hi, lo := id>>readyChunkBits, uint16(id)
	i := r.chunk(hi)
	if i == len(r.chunks) || r.chunks[i].hi != hi {
		r.chunks = slices.Insert(r.chunks, i, readyChunk{hi: hi})
	}
	c := &r.chunks[i]
	if c.bits != nil {
		w, b := lo/64, uint64(1)<<(lo%64)
		if c.bits[w]&b == 0 {
			c.bits[w] |= b
			c.n++
			r.n++
		}
		return
	}
	j, ok := slices.BinarySearch(c.low, lo)
	if ok {
		return
	}
	c.low = slices.Insert(c.low, j, lo)
	c.n++
	r.n++
	if c.n >= readyChunkDense {
		c.bits = make([]uint64, readyChunkWords)
		for _, v := range c.low {
			c.bits[v/64] |= 1 << (v % 64)
		}
		c.low = nil
	}
}

// Delete removes id from the set.
func (r *readySet) Delete(id uint64) {
	hi, lo := id>>readyChunkBits, uint16(id)
	i := r.chunk(hi)
	if i == len(r.chunks) || r.chunks[i].hi != hi {
		return
	}
	c := &r.chunks[i]
	if c.bits != nil {
		w, b := lo/64, uint64(1)<<(lo%64)
		if c.bits[w]&b == 0 {
			return
		}
		c.bits[w] &^= b
		c.n--
		r.n--
		if c.n < readyChunkDense/2 {
			// Back to a list (half the threshold, so that a chunk at
			// the edge does not convert at every change).
			low := make([]uint16, 0, c.n)
			for w, x := range c.bits {
				for x != 0 {
					low = append(low, uint16(w*64+bits.TrailingZeros64(x)))
					x &= x - 1
				}
			}
			c.low, c.bits = low, nil
		}
	} else {
		j, ok := slices.BinarySearch(c.low, lo)
		if !ok {
			return
		}
		c.low = slices.Delete(c.low, j, j+1)
		c.n--
		r.n--
	}
	if c.n == 0 {
		r.chunks = slices.Delete(r.chunks, i, i+1)
	}
}

// AscendGreaterOrEqual calls fn with each id at or above from, in
// increasing order, until fn returns false.
func (r *readySet) AscendGreaterOrEqual(from uint64, fn func(id uint64) bool) {
	for i := r.chunk(from >> readyChunkBits); i < len(r.chunks); i++ {
		c := &r.chunks[i]
		base := c.hi << readyChunkBits
		start := 0 // the first low value to visit
		if c.hi == from>>readyChunkBits {
			start = int(uint16(from))
		}
		if c.bits == nil {
			j, _ := slices.BinarySearch(c.low, uint16(start))
			for _, v := range c.low[j:] {
				if !fn(base | uint64(v)) {
					return
				}
			}
			continue
		}
		for w := start / 64; w < readyChunkWords; w++ {
			x := c.bits[w]
			if w == start/64 {
				x &^= 1<<(start%64) - 1
			}
			for x != 0 {
				if !fn(base | uint64(w*64+bits.TrailingZeros64(x))) {
					return
				}
				x &= x - 1
			}
		}
	}
}
