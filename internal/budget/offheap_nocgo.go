//go:build !cgo

package budget

// PebbleOffHeap: without cgo, Pebble allocates its cache and memtables on
// the Go heap, so GOMEMLIMIT counts them.
const PebbleOffHeap = false
