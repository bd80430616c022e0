package state

// MemoryBudget returns the sizes Pebble was opened with: its block cache
// and one memtable (up to four memtables are held before writes stall).
func (s *Store) MemoryBudget() (cacheBytes, memTableBytes int64) {
	return s.cacheBytes, s.memTableBytes
}
