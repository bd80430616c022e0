//go:build cgo

package budget

// PebbleOffHeap: with cgo, Pebble allocates its cache and memtables
// outside the Go heap, so GOMEMLIMIT does not count them.
const PebbleOffHeap = true
