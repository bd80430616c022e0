package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// fsyncFloor measures this disk's fsync latency where the servers keep
// their data: 200 appends of 4 KiB, each followed by fsync. A durable
// write cannot be acknowledged faster than one fsync, so its p50 and p99
// are the floor under queen's push latency (JetStream's default
// configuration acknowledges before its data reaches the disk).
func fsyncFloor(dir string) string {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	defer os.Remove(filepath.Clean(f.Name()))
	defer f.Close()
	buf := make([]byte, 4096)
	var d []time.Duration
	for range 200 {
		if _, err := f.Write(buf); err != nil {
			return "unknown (" + err.Error() + ")"
		}
		t := time.Now()
		if err := f.Sync(); err != nil {
			return "unknown (" + err.Error() + ")"
		}
		d = append(d, time.Since(t))
	}
	slices.Sort(d)
	return fmt.Sprintf("p50 %s, p99 %s", fmtDur(d[len(d)/2]), fmtDur(d[len(d)*99/100]))
}
