//go:build !cgo || !linux

package main

// limitMallocArenas does nothing where Pebble does not allocate with
// glibc's allocator.
func limitMallocArenas() int { return 0 }
