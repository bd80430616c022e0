//go:build !cgo

package main

// pebbleOffHeap: without cgo, Pebble allocates its cache and memtables on
// the Go heap, so GOMEMLIMIT counts them.
const pebbleOffHeap = false
