package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	waltypes "github.com/hashicorp/raft-wal/types"
)

// Spare segments: under FsyncAlways a new raft log segment is a file whose
// blocks were written with zeros and synced beforehand, not one that
// raft-wal preallocates with fallocate.
//
// Why: fallocate leaves the blocks unwritten (in ext4's and XFS's terms),
// so the first write to each block converts its extent when it is written
// back, and an fdatasync that covers such a write must commit that
// metadata change through the file system's journal, behind whatever else
// the journal holds (Pebble's flushes and compactions). Over blocks already
// written, fdatasync writes the data and flushes the disk's cache, nothing
// more. On the test machine that made fdatasync p50 80 against 130 µs
// alone, and the rounds' fsyncs inside the server p50 486 against 692 µs
// under a push load (docs/benchmarks.md, session 13).
//
// One spare is kept beside the segments (spareName, which raft-wal's
// listing ignores: it lists names ending in .wal). A segment raft-wal
// creates takes it by a rename, and each Create starts a goroutine that
// writes the next one in the background (spareTmp, renamed once whole and
// synced). When none is ready (the first segment since the process
// started, one still being written, or writing one failed) raft-wal's
// preallocated file is used, as before. The content is the same either
// way: zeros, which is what raft-wal reads past the end of a segment's
// appends. The cost is the disk space of one segment and a write of
// zeros as large as each segment.
const (
	spareName = "spare-segment.zero"
	spareTmp  = "spare-segment.zero.tmp"
)

type spareSegments struct {
	log  *slog.Logger
	size uint64 // the segments' size (set by open)

	mu      sync.Mutex
	dir     string
	ready   bool // spareName in dir holds size bytes of zeros, synced
	writing bool
	closed  bool
	creates int // segments created since open
	wg      sync.WaitGroup

	used atomic.Uint64 // segments created from a spare
}

// open keeps a spare the last run left in dir; the next is written only
// once a segment is created (a rotation), for the one after it, so that a
// log that never rotates (most tests', a short benchmark's) writes none.
func (sp *spareSegments) open(dir string, size uint64) {
	sp.mu.Lock()
	sp.dir, sp.size = dir, size
	sp.mu.Unlock()
	os.Remove(filepath.Join(dir, spareTmp))
	if fi, err := os.Stat(filepath.Join(dir, spareName)); err == nil && fi.Mode().IsRegular() && uint64(fi.Size()) == size {
		sp.mu.Lock()
		sp.ready = true
		sp.mu.Unlock()
		return
	}
	os.Remove(filepath.Join(dir, spareName))
}

// take renames the spare to the segment name, or reports false when no
// spare is ready; from the second segment created on, either way the next
// spare is prepared.
func (sp *spareSegments) take(dir, name string, size uint64) (waltypes.WritableFile, bool) {
	sp.mu.Lock()
	if sp.creates++; sp.creates > 1 {
		// Not the process's first segment: the log rotates.
		defer sp.prepare()
	}
	ok := sp.ready && !sp.closed && dir == sp.dir && size == sp.size
	if ok {
		sp.ready = false
	}
	sp.mu.Unlock()
	if !ok {
		return nil, false
	}
	path := filepath.Join(dir, name)
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		// raft-wal creates with O_EXCL: let its Create report the clash.
		os.Remove(filepath.Join(dir, spareName))
		return nil, false
	}
	if err := os.Rename(filepath.Join(dir, spareName), path); err != nil {
		sp.log.Warn("using the spare raft log segment failed; preallocating one instead", "err", err)
		os.Remove(filepath.Join(dir, spareName))
		return nil, false
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0o644)
	if err != nil {
		// The rename took the name: raft-wal's Create would now clash.
		os.Remove(path)
		sp.log.Warn("opening the spare raft log segment failed; preallocating one instead", "err", err)
		return nil, false
	}
	sp.used.Add(1)
	return &spareFile{File: f, dir: dir}, true
}

// prepare starts writing the next spare unless one is ready or being
// written.
func (sp *spareSegments) prepare() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.ready || sp.writing || sp.closed || sp.dir == "" {
		return
	}
	sp.writing = true
	dir, size := sp.dir, sp.size
	sp.wg.Add(1)
	go func() {
		defer sp.wg.Done()
		err := writeSpare(dir, size, time.Millisecond)
		sp.mu.Lock()
		sp.writing = false
		sp.ready = err == nil
		sp.mu.Unlock()
		if err != nil {
			sp.log.Warn("writing a spare raft log segment failed; the next segment is preallocated instead", "dir", dir, "err", err)
		}
	}()
}

// close waits for a spare being written (the log's directory may be
// removed next).
func (sp *spareSegments) close() {
	sp.mu.Lock()
	sp.closed = true
	sp.mu.Unlock()
	sp.wg.Wait()
}

// writeSpare writes size bytes of zeros to spareTmp in dir, syncs it and
// renames it to spareName. It writes a MiB at a time, syncing every 4 MiB,
// pausing between MiBs, so that the log's own fsyncs do not queue behind
// one long writeback.
func writeSpare(dir string, size uint64, pause time.Duration) (err error) {
	tmp := filepath.Join(dir, spareTmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	zeros := make([]byte, 1<<20)
	for off := uint64(0); off < size; {
		n := min(uint64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], int64(off)); err != nil {
			return fmt.Errorf("write %s: %w", tmp, err)
		}
		off += n
		if off%(4<<20) == 0 || off == size {
			if err := dataSync(f); err != nil {
				return fmt.Errorf("sync %s: %w", tmp, err)
			}
		}
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, spareName)); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}

// spareFile is a segment made from a spare. Like raft-wal's own files, its
// first Sync also syncs the directory, which holds its new name.
type spareFile struct {
	*os.File
	dir    string
	synced atomic.Bool
}

func (f *spareFile) Sync() error {
	if err := f.File.Sync(); err != nil {
		return err
	}
	if f.synced.Swap(true) {
		return nil
	}
	d, err := os.Open(f.dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}
