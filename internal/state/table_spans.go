package state

import "github.com/cockroachdb/pebble/v2"

// tableSpans ends every table Pebble writes (a flush's or a compaction's
// output) at the end of a table of the store's key space (the key's first
// byte, keys.go), so that no table holds keys of two of them.
//
// Without it a flush cuts its tables by size only, and one of them spans
// from the last keys of one table to the first keys of the next: from the
// newest message keys to the first ready keys, say. That table's key range
// then holds every message key written after it (new partitions' ids, new
// offsets of the last partition), so each later flush overlaps it, level 0
// stacks up over the whole table, and Pebble compacts keys that merely
// landed in the gap (docs/design/state.md, "What a million new partitions
// leave to compact"). With tables cut at the boundaries, keys written in
// ascending order (new partitions' records, messages and ready keys) flush
// into tables that overlap nothing older, and are not compacted with it.
//
// The first four tables (meta, tenants, queue names and queue records) share
// one span: they are small, rewritten in place by most applies, and a table
// of their own each would add two files to every flush.
//
// Values leave for blob files (blobs.go) only in the tables that hold
// payloads: messages, dead letters and the KV table. Everywhere else they
// stay inline whatever their size: a pop's lease record, listing the
// partitions it leased, is often over blobMinSize and is deleted by the
// acknowledgement soon after, and a blob file is worth its indirection only
// for a value that lives and is compacted for a while.
func tableSpans(start []byte) (pebble.SpanPolicy, []byte, error) {
	switch {
	case len(start) == 0 || start[0] < tPartName:
		return valuesInline, []byte{tPartName}, nil
	case start[0] >= tTableLimit:
		return pebble.SpanPolicy{}, nil, nil
	}
	p := valuesInline
	switch start[0] {
	case tMsg, tDLQ, tKV:
		p = pebble.SpanPolicy{}
	}
	return p, []byte{start[0] + 1}, nil
}

// valuesInline is the span policy of tables whose values stay in their tables.
var valuesInline = pebble.SpanPolicy{ValueStoragePolicy: pebble.ValueStorageLowReadLatency}
