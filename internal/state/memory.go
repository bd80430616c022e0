package state

// MemoryBudget returns the sizes Pebble was opened with: its block cache's
// share for blocks and one memtable (up to four memtables are held before
// writes stall).
func (s *Store) MemoryBudget() (cacheBytes, memTableBytes int64) {
	return s.cacheBytes, s.memTableBytes
}

// heldMemTables is how many memtables a store holds while it writes
// steadily: the one filling and either the one flushing or, after the
// flush, the same one kept for reuse. Pebble charges each memtable it holds
// against its block cache's capacity, so the cache is created that many
// memtables larger than the blocks' share (pebbleCacheBytes).
const heldMemTables = 2

// pebbleCacheBytes is the capacity of the Pebble cache: the blocks' share
// and the reservations of the memtables held in steady writing. When
// flushes fall behind, the memtables waiting take their room from blocks.
func pebbleCacheBytes(cacheBytes, memTableBytes int64) int64 {
	return cacheBytes + heldMemTables*memTableBytes
}

// BlockCacheStats is what Pebble's block cache holds and how reads have
// fared since the store opened.
type BlockCacheStats struct {
	// Bytes and Blocks are what the cache holds now.
	Bytes, Blocks int64
	// Hits and Misses count the block reads the cache served and those
	// that went to the files.
	Hits, Misses int64
}

// BlockCache reports the block cache's contents and hit counts.
func (s *Store) BlockCache() BlockCacheStats {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.db == nil {
		return BlockCacheStats{}
	}
	c := s.db.Metrics().BlockCache
	return BlockCacheStats{Bytes: c.Size, Blocks: c.Count, Hits: c.Hits, Misses: c.Misses}
}
