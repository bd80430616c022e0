//go:build cgo

package main

// pebbleOffHeap: with cgo, Pebble allocates its cache and memtables
// outside the Go heap, so GOMEMLIMIT does not count them.
const pebbleOffHeap = true
