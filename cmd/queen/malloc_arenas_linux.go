//go:build cgo && linux

package main

/*
#include <malloc.h>

// queen_limit_arenas caps the C allocator's arenas where it has them
// (glibc); elsewhere it does nothing and returns 0.
static int queen_limit_arenas(int n) {
#ifdef M_ARENA_MAX
	return mallopt(M_ARENA_MAX, n);
#else
	(void)n;
	return 0;
#endif
}
*/
import "C"

import "os"

// mallocArenas is how many arenas the C allocator may use under a memory
// limit. Pebble allocates its blocks and memtables with C's allocator from
// whichever threads read or write; glibc gives busy threads arenas of their
// own (up to eight per core), and each arena keeps freed blocks for
// itself, which a churning block cache turns into resident memory that
// nothing uses (docs/operations.md, "Memory").
const mallocArenas = 2

// limitMallocArenas caps glibc's arenas at mallocArenas unless
// MALLOC_ARENA_MAX in the environment set them already. It returns the
// cap in force, 0 when it set none.
func limitMallocArenas() int {
	if os.Getenv("MALLOC_ARENA_MAX") != "" {
		return 0
	}
	if C.queen_limit_arenas(C.int(mallocArenas)) != 1 {
		return 0
	}
	return mallocArenas
}
