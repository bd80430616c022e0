package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryBudget is how QUEEN_MEMORY_LIMIT is shared out: Pebble's block
// cache, its memtables, the results kept for retried requests, and a soft
// limit for the Go heap (the record caches, those results, requests in
// flight, raft's buffers), which the runtime defends by collecting more
// often.
type memoryBudget struct {
	Limit         int64
	CacheBytes    int64
	MemTableBytes int64
	DedupBytes    int64
	GoLimit       int64
}

const (
	minMemoryLimit = 128 << 20
	// defaultMemoryLimit applies when QUEEN_MEMORY_LIMIT is unset: a node
	// that pushes and consumes ten million messages stays under 150 MB of
	// resident memory (docs/operations.md, "Memory").
	defaultMemoryLimit = 128 << 20
)

// budgetFor divides limit: a thirty-second for the block cache's blocks,
// an eighth for each memtable (4-64 MiB; Pebble fills one while it flushes
// or keeps for reuse the one before, and holds up to four when flushes fall
// behind), a sixteenth (4-64 MiB) for the results of recent requests, and
// what the blocks and two memtables leave for the Go heap, which holds those
// results too. Pebble's cache is the blocks' share plus the two memtables,
// which Pebble charges against it (state.Options.CacheBytes). The Go limit is
// soft, and the heap reaches it only when it holds much. Memtables get more
// than blocks because their size matters more to writes than the blocks'
// to reads (docs/benchmarks.md, "Session 23"). When Pebble
// allocates on the Go heap (builds without cgo) the Go limit is the whole.
func budgetFor(limit int64) memoryBudget {
	b := memoryBudget{Limit: limit, CacheBytes: limit / 32, MemTableBytes: min(max(limit/8, 4<<20), 64<<20),
		DedupBytes: min(max(limit/16, 4<<20), 64<<20)}
	b.GoLimit = limit - b.CacheBytes - 2*b.MemTableBytes
	if !pebbleOffHeap {
		b.GoLimit = limit
	}
	return b
}

// parseBytes reads a size: a number of bytes, or one with a unit (KiB, MiB,
// GiB, TiB, or KB, MB, GB, TB for powers of ten; B optional).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToUpper(strings.TrimSpace(t[i:]))
	mult := map[string]float64{"": 1, "B": 1,
		"K": 1 << 10, "KIB": 1 << 10, "KB": 1e3, "M": 1 << 20, "MIB": 1 << 20, "MB": 1e6,
		"G": 1 << 30, "GIB": 1 << 30, "GB": 1e9, "T": 1 << 40, "TIB": 1 << 40, "TB": 1e12}[unit]
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 0 || v < 0 {
		return 0, fmt.Errorf("%q: want a size such as 512MiB or 2GiB", s)
	}
	if v*mult > 1<<62 {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return int64(v * mult), nil
}

// memoryFromSetting reads QUEEN_MEMORY_LIMIT (or the flag's value): unset
// is defaultMemoryLimit, "off" leaves every size at its own default and the
// Go heap without a limit (a zero budget).
func memoryFromSetting(v string) (memoryBudget, error) {
	v = strings.TrimSpace(v)
	switch strings.ToLower(v) {
	case "":
		return budgetFor(defaultMemoryLimit), nil
	case "off":
		return memoryBudget{}, nil
	}
	n, err := parseBytes(v)
	if err != nil {
		return memoryBudget{}, fmt.Errorf("QUEEN_MEMORY_LIMIT / -memory-limit %w, or off", err)
	}
	if n < minMemoryLimit {
		return memoryBudget{}, fmt.Errorf("QUEEN_MEMORY_LIMIT / -memory-limit %q: want at least 128MiB (or off for Pebble's own sizes and no heap limit)", v)
	}
	return budgetFor(n), nil
}

// apply sets the Go heap's soft limit, unless GOMEMLIMIT in the
// environment already decided it. It returns the limit in force.
func (b memoryBudget) apply() int64 {
	if b.Limit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(b.GoLimit)
	}
	return debug.SetMemoryLimit(-1)
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%.0fMiB", float64(n)/(1<<20))
	default:
		return strconv.FormatInt(n, 10) + "B"
	}
}
