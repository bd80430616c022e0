package state

import (
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Message payloads of blobMinSize bytes or more leave the LSM's tables when
// a memtable is flushed: Pebble writes them into blob files and the tables
// keep a small reference. Compactions then move only keys and references,
// so a payload is written twice (the Raft log, then its blob file) instead
// of once more at every level it passes through.
//
// A queue is written in log order and dropped by range (retention, queue
// delete), so blob files mostly die whole, together with the tables that
// reference them. Pebble rewrites a file that is partly garbage only once
// it is older than blobRewriteAge and more than blobGarbageRatio of it is
// garbage.
//
// Measured on 1 KiB pushes over 100 partitions for 20 and 60 s
// (docs/benchmarks.md, fifth session): 12-20% less server CPU and 12-17%
// fewer bytes written per message. Payloads under the threshold, and every
// value outside the message, dead-letter and KV tables (records, cursors,
// leases: tableSpans), stay inline.
const (
	blobMinSize = 256
	// blobMaxDepth bounds how many overlapping blob files one table may
	// reference before a compaction copies the values into new ones. L0
	// holds up to L0StopWritesThreshold (48) overlapping files; a lower
	// bound had L0 compactions rewrite the values they should only move.
	blobMaxDepth     = 64
	blobRewriteAge   = 5 * time.Minute
	blobGarbageRatio = 0.5
)

// storeFormat is the store's Pebble format, the first that has blob files.
// Opening a store written in an older format ratchets it up to this one,
// after which older builds cannot open it (docs/operations.md). A variable
// so that a test can write a store in an older format.
var storeFormat = pebble.FormatValueSeparation

func valueSeparation() pebble.ValueSeparationPolicy {
	return pebble.ValueSeparationPolicy{
		Enabled:               true,
		MinimumSize:           blobMinSize,
		MaxBlobReferenceDepth: blobMaxDepth,
		RewriteMinimumAge:     blobRewriteAge,
		TargetGarbageRatio:    blobGarbageRatio,
	}
}
