// Package budget shares a node's memory limit (QUEEN_MEMORY_LIMIT) out
// between Pebble's block cache and memtables, the results kept for
// retried requests, and the Go heap's soft limit. The binary applies it;
// benchmarks use it to run a broker sized as the binary's default.
package budget

// Budget is how a limit is shared out. The zero Budget leaves every size
// at its own default and the Go heap without a limit.
type Budget struct {
	Limit         int64
	CacheBytes    int64 // the block cache's blocks (state.Options.CacheBytes)
	MemTableBytes int64 // one memtable
	DedupBytes    int64 // the results of recent requests, for retries
	GoLimit       int64 // the Go heap's soft limit (GOMEMLIMIT)
}

const (
	// Min is the smallest limit a node accepts.
	Min = 128 << 20
	// Default applies when no limit is set: a node that pushes and
	// consumes ten million messages stays under 150 MB of resident memory
	// (docs/operations.md, "Memory").
	Default = 128 << 20
)

// For divides limit: a thirty-second for the block cache's blocks, an
// eighth for each memtable (4-64 MiB; Pebble fills one while it flushes or
// keeps for reuse the one before, and holds up to four when flushes fall
// behind), a thirty-second (4-64 MiB) for the results of recent requests,
// and what the blocks and two memtables leave for the Go heap, which holds
// those results too. Pebble's cache is the blocks' share plus the two
// memtables, which Pebble charges against it (state.Options.CacheBytes).
// The Go limit is soft, and the heap reaches it only when it holds much.
// Memtables get more than blocks because their size matters more to writes
// than the blocks' to reads (docs/benchmarks.md, "Session 23"). When Pebble
// allocates on the Go heap (builds without cgo) the Go limit is the whole.
func For(limit int64) Budget {
	b := Budget{Limit: limit, CacheBytes: limit / 32, MemTableBytes: min(max(limit/8, 4<<20), 64<<20),
		DedupBytes: min(max(limit/32, 4<<20), 64<<20)}
	b.GoLimit = limit - b.CacheBytes - 2*b.MemTableBytes
	if !PebbleOffHeap {
		b.GoLimit = limit
	}
	return b
}
