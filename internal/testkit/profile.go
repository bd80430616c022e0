package testkit

import (
	"os"
	"runtime/pprof"
	"testing"
)

// CPUProfile starts a CPU profile written to path and returns what stops
// it; with path empty it does nothing. Benchmarks use it to profile their
// measured loop only (QUEEN_BENCH_CPUPROFILE).
func CPUProfile(tb testing.TB, path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		tb.Fatalf("cpu profile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		tb.Fatalf("cpu profile: %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			tb.Errorf("cpu profile: %v", err)
		}
	}
}
