package state

// WriteStats is what the store has written since it was opened: the bytes
// of applied batches that went into Pebble's memtables, and what Pebble
// wrote when it flushed them into tables and blob files and when it
// compacted those. Measurements of where a message's bytes go read it.
type WriteStats struct {
	// BatchBytes is the size of the applied batches (keys, values and
	// Pebble's batch framing) inserted into the memtables.
	BatchBytes uint64
	// FlushedTableBytes and FlushedBlobBytes are what memtable flushes
	// wrote: sstables (keys and the values kept inline) and blob files
	// (the separated payloads).
	FlushedTableBytes, FlushedBlobBytes uint64
	// CompactedTableBytes and CompactedBlobBytes are what compactions
	// wrote, at every level.
	CompactedTableBytes, CompactedBlobBytes uint64
	Flushes, Compactions                    int64
	// L0Sublevels and L0Files are the shape of level 0 now: writes stall
	// when too many tables overlap there.
	L0Sublevels int32
	L0Files     int64
	// WriteStalls counts the times Pebble held writes back (too many
	// memtables or L0 files).
	WriteStalls int64
}

// WriteStats reports the store's write statistics.
func (s *Store) WriteStats() WriteStats {
	s.life.RLock()
	defer s.life.RUnlock()
	w := WriteStats{BatchBytes: s.batchBytes.Load()}
	if s.db == nil {
		return w
	}
	m := s.db.Metrics()
	for i := range m.Levels {
		l := &m.Levels[i]
		w.FlushedTableBytes += l.TableBytesFlushed
		w.FlushedBlobBytes += l.BlobBytesFlushed
		w.CompactedTableBytes += l.TableBytesCompacted
		// Pebble counts a flush's blob files in BlobBytesCompacted too.
		w.CompactedBlobBytes += l.BlobBytesCompacted - l.BlobBytesFlushed
	}
	w.Flushes, w.Compactions = m.Flush.Count, m.Compact.Count
	w.L0Sublevels, w.L0Files = m.Levels[0].Sublevels, m.Levels[0].TablesCount
	w.WriteStalls = s.writeStalls.Load()
	return w
}
