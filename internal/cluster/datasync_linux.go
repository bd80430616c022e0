package cluster

import (
	"errors"
	"os"
	"syscall"
)

// overlapSafe: Linux reports a file's writeback error to every handle open
// on it, so two sync rounds may fsync one segment at once (syncrounds.go).
const overlapSafe = true

// dataSync is fdatasync(2), retried when interrupted.
func dataSync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
