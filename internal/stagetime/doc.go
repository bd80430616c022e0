// Package stagetime times a request's stages through the server (HTTP
// decode, validation, proposal, the raft log write, replication, the state
// machine's apply, the reply) when a benchmark switches it on. It owns the
// hooks and the records they fill; tests/stages reads them and prints the
// table of docs/benchmarks.md ("Where a push and a pop spend their time").
//
// Off, which is the default and the only state outside that benchmark, each
// hook is one atomic load: Start returns nil, every method of a nil *Trace
// returns at once, and no timestamps are taken.
//
// A stamp holds the wall clock and the calling thread's CPU clock. A
// stage's CPU time is the difference of the CPU clocks of its two stamps
// when both were taken on the same thread (so the goroutine did not move);
// its waiting time is the rest of its wall time.
//
// Files:
//   - stagetime.go: switching on and off, Trace (one request's stamps) and
//     Entry (one raft log entry's stamps, shared by the requests grouped into
//     it), and the index of entries by log index for followers.
//   - clock_linux.go, clock_other.go: the thread CPU clock.
package stagetime
