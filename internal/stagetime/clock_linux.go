//go:build linux

package stagetime

import "golang.org/x/sys/unix"

// threadCPU is the calling thread's CPU time in ns and the thread's id.
func threadCPU() (int64, int32) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return -1, 0
	}
	return ts.Nano(), int32(unix.Gettid())
}
