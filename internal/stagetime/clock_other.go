//go:build !linux

package stagetime

// threadCPU is unknown off Linux: stages then report wall time only.
func threadCPU() (int64, int32) { return -1, 0 }
