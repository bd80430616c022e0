package state

import "github.com/cockroachdb/pebble/v2"

// batchSizer sizes the Pebble batch an ApplyBatch starts with from the
// entries' bytes, so that the large rounds of many producers' pushes are
// built in one buffer instead of doubling their way up from Pebble's
// default, copying all they hold at each step. What a batch writes per
// entry byte depends on the messages (a payload of 1 KiB adds little
// besides itself, one of 30 bytes adds more in keys than it holds), so
// the ratio of the last sized batch stands for the next. Used under
// Store.mu.
type batchSizer struct {
	ratio float64 // batch bytes per entry byte; 0 before the first
	// sized and grew describe the last sized batch: the size it started
	// at, and whether it outgrew it (tests read them).
	sized int
	grew  bool
}

// minSizedBatch is the entries' size below which a batch starts at
// Pebble's default and reuses a pooled buffer.
const minSizedBatch = 64 << 10

// entryBytes sums the entries' sizes.
func entryBytes(entries []LogEntry) int {
	n := 0
	for _, e := range entries {
		n += len(e.Data)
	}
	return n
}

// size is the batch size to start at for n bytes of entries (0: Pebble's
// pooled default).
func (z *batchSizer) size(n int) int {
	if n < minSizedBatch {
		return 0
	}
	r := z.ratio
	if r == 0 {
		r = 1.25
	}
	z.sized = int(float64(n)*r*1.0625) + 4<<10
	return z.sized
}

// learn notes what a batch sized for n bytes of entries came to.
func (z *batchSizer) learn(n, batchLen int) {
	if n < minSizedBatch {
		return
	}
	z.grew = batchLen > z.sized
	z.ratio = min(max(float64(batchLen)/float64(n), 1), 16)
}

// newBatch is an indexed batch with room for size bytes (0: Pebble's
// pooled default).
func (s *Store) newBatch(size int) *pebble.Batch {
	if size <= 0 {
		return s.db.NewIndexedBatch()
	}
	return s.db.NewIndexedBatchWithSize(size)
}
