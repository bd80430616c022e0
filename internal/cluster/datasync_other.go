//go:build !linux

package cluster

import "os"

// overlapSafe: elsewhere the sync rounds run one at a time on raft-wal's
// own handle (syncrounds.go).
const overlapSafe = false

func dataSync(f *os.File) error { return f.Sync() }
