package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	walfs "github.com/hashicorp/raft-wal/fs"
	waltypes "github.com/hashicorp/raft-wal/types"
)

// Sync rounds of the raft log, and how two of them overlap.
//
// A round reads the log's last index, fsyncs every segment written since
// the last round began, and then records that index as synced: every entry
// through it was written before the round's fsyncs began. A write that
// arrives while a round's fsync runs is not covered by it; with one lane it
// waits out that round and then its own. With syncLanes lanes a second
// round starts at once beside the first, on its own handle of each file,
// so that write waits for one fsync only.
//
// Two rules keep an overlap from weakening what a round promises:
//   - each lane fsyncs through its own file handle (its own open file
//     description), one fsync at a time. Linux reports a writeback error to
//     every handle open when it happened (errseq, since 4.13), so a lane's
//     fsync that succeeds covers everything written before it began even
//     when the other lane's fsync of the same file runs or fails meanwhile;
//     on one shared handle the first of two concurrent fsyncs to check would
//     take the error and the other could report success.
//   - rounds count in the order they began: a round records its index only
//     after every earlier round has ended without an error, and after a
//     failed fsync no round counts (logSyncer.fail).
//
// A file system that cannot open such handles (syncOpener; the tests'
// fault-injecting ones, an OS other than Linux) gets one lane: rounds run
// one after the other, on raft-wal's own handle.

// syncLanes bounds the rounds whose fsyncs run at once.
const syncLanes = 2

// syncHandle is a handle on a segment file used only to make it durable.
type syncHandle interface {
	Sync() error
	Close() error
}

// syncOpener is a segment file system that opens sync handles.
type syncOpener interface {
	OpenSync(dir, name string) (syncHandle, error)
}

// osSegmentFS is the OS's file system under the segments: raft-wal's,
// with sync handles where the OS reports writeback errors to every handle,
// and new segments made from spares written ahead (spare, nil: none;
// spareseg.go).
func osSegmentFS(spare *spareSegments, trash *segmentTrash) waltypes.VFS {
	if !overlapSafe {
		return walfs.New()
	}
	return osSyncFS{FS: walfs.New(), spare: spare, trash: trash}
}

type osSyncFS struct {
	*walfs.FS
	spare *spareSegments
	trash *segmentTrash
}

// Delete drops a segment without unlinking it under raft-wal's write lock
// (segtrash.go).
func (o osSyncFS) Delete(dir, name string) error {
	if o.trash == nil {
		return o.FS.Delete(dir, name)
	}
	return o.trash.drop(dir, name)
}

func (o osSyncFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	if o.spare != nil {
		if f, ok := o.spare.take(dir, name, size); ok {
			return f, nil
		}
	}
	return o.FS.Create(dir, name, size)
}

func (osSyncFS) OpenSync(dir, name string) (syncHandle, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("open a sync handle on raft log segment %s: %w", name, err)
	}
	return dataSyncFile{f}, nil
}

// dataSyncFile syncs a segment's data (fdatasync where the OS has it): the
// segment was preallocated and its first sync was a full one (syncOn), so
// what remains to make durable is its data and the block mapping that
// reads it back, not its timestamps.
type dataSyncFile struct{ f *os.File }

func (d dataSyncFile) Sync() error  { return dataSync(d.f) }
func (d dataSyncFile) Close() error { return d.f.Close() }

// syncRound is one round in the order of rounds.
type syncRound struct {
	prev *syncRound // the round begun before it, until it ended
	done chan struct{}
	err  error // set before done is closed
}

// syncRound fsyncs every segment written since the last round began and,
// once every earlier round has ended without an error, records the index
// that was written before it began as synced. It waits for a free lane.
func (s *logSyncer) syncRound() error { return s.round(true) }

// syncSegments is a round that records no index: raft-wal's own syncs (a
// segment sealed or closed, its metadata committed) in the middle of an
// append, which the append's caller records.
func (s *logSyncer) syncSegments() error { return s.round(false) }

func (s *logSyncer) round(record bool) error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	idx := s.lastIndex()
	s.rmu.Lock()
	return s.roundOn(s.takeLane(), record, idx)
}

// takeIdle takes a lane for a round on the calling goroutine (roundTaken)
// when no lane is fsyncing: the write that wants the round then waits for
// no worker to be woken and scheduled. false: a round is fsyncing, and a
// worker's round (demand) starts beside it.
func (s *logSyncer) takeIdle() bool {
	if s.failed.Load() != nil {
		return false
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for _, busy := range s.laneBusy {
		if busy {
			return false
		}
	}
	s.laneBusy[0] = true
	return true
}

// roundTaken is a round on the lane takeIdle took: the same round as a
// worker's, on the caller's goroutine.
func (s *logSyncer) roundTaken() error {
	idx := s.lastIndex()
	s.rmu.Lock()
	if p := s.failed.Load(); p != nil {
		s.laneBusy[0] = false
		s.laneFree.Signal()
		s.rmu.Unlock()
		return *p
	}
	s.idle.Add(1)
	return s.roundOn(0, true, idx)
}

// uncovered reports whether the leader's own appends written without
// their fsync hold an entry that no round begun since covers.
func (s *logSyncer) uncovered() bool {
	return s.owed.Load() > s.begun.Load()
}

// roundOn runs a round on lane, which the caller took; s.rmu is held, and
// roundOn unlocks it. idx is the log's last index, read by the caller
// before it took s.rmu: reading it can close segments that a truncation
// released (raft-wal closes them when the last reader of the old state lets
// go), and closing a segment runs a round of its own, which takes s.rmu.
func (s *logSyncer) roundOn(lane int, record bool, idx uint64) error {
	epoch := s.epoch
	if record && idx > s.begun.Load() {
		// Only a round that records its index covers an own append: the
		// rounds of raft-wal's own syncs record none.
		s.begun.Store(idx)
	}
	var todo []*deferredFile
	for f := range s.files {
		// Read after the index: a write of an entry through idx is
		// counted here, or was by a round begun before.
		if w := f.wseq.Load(); w > f.started {
			f.started = w
			todo = append(todo, f)
		}
	}
	r := &syncRound{prev: s.last, done: make(chan struct{})}
	s.last = r
	s.begins.Add(1)
	s.rmu.Unlock()

	var err error
	n := 0
	for _, f := range todo {
		if err = f.syncOn(lane); err != nil {
			break
		}
		n++
	}
	s.rmu.Lock()
	s.laneBusy[lane] = false
	s.laneFree.Signal()
	s.rmu.Unlock()
	if r.prev != nil {
		<-r.prev.done
		if err == nil {
			err = r.prev.err
		}
		r.prev = nil
	}
	if err == nil {
		if p := s.failed.Load(); p != nil {
			err = *p
		}
	}
	up := false
	if err != nil {
		err = s.fail(err)
	} else {
		if n > 0 {
			s.rounds.Add(1)
		}
		s.rmu.Lock()
		if record && epoch == s.epoch {
			up = s.raiseSynced(idx)
		}
		s.rmu.Unlock()
	}
	r.err = err
	close(r.done)
	if up && s.onSynced != nil {
		s.onSynced()
	}
	return err
}

// takeLane waits for a free lane and takes it (s.rmu held).
func (s *logSyncer) takeLane() int {
	for {
		for i, busy := range s.laneBusy {
			if !busy {
				s.laneBusy[i] = true
				return i
			}
		}
		s.laneFree.Wait()
	}
}

// deferredVFS is raft-wal's file system with each writable file's fsync
// deferred to the syncer.
type deferredVFS struct {
	waltypes.VFS
	s *logSyncer
}

func (v *deferredVFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return v.track(f, dir, name, false)
}

// OpenWriter opens a segment of the last run, which may hold writes it
// never synced: it counts as written.
func (v *deferredVFS) OpenWriter(dir, name string) (waltypes.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return v.track(f, dir, name, true)
}

func (v *deferredVFS) track(f waltypes.WritableFile, dir, name string, written bool) (*deferredFile, error) {
	d := &deferredFile{WritableFile: f, s: v.s}
	if written {
		d.wseq.Store(1)
	}
	if so, ok := v.VFS.(syncOpener); ok {
		for range v.s.lanes {
			h, err := so.OpenSync(dir, name)
			if err != nil {
				d.closeHandles()
				f.Close()
				return nil, err
			}
			d.h = append(d.h, h)
		}
	}
	v.s.rmu.Lock()
	v.s.files[d] = struct{}{}
	v.s.rmu.Unlock()
	return d, nil
}

// deferredFile is a segment file whose Sync is a sync round (or nothing,
// when its fsync is deferred); the rounds fsync it.
type deferredFile struct {
	waltypes.WritableFile
	s    *logSyncer
	h    []syncHandle  // one per lane; nil: raft-wal's handle, one lane
	wseq atomic.Uint64 // writes so far
	// started is the wseq the last round that fsyncs this file read (s.rmu).
	started uint64
	fullMu  sync.Mutex
	full    bool // synced once on raft-wal's handle (fullMu)
}

func (f *deferredFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.WritableFile.WriteAt(p, off)
	f.wseq.Add(1)
	return n, err
}

// syncOn fsyncs the file on a lane. The first sync of a file is raft-wal's
// own (which also syncs the directory of a new file), on one lane at a
// time; the later ones run on the lane's handle.
func (f *deferredFile) syncOn(lane int) error {
	if f.h == nil || !f.isFull() {
		f.fullMu.Lock()
		if f.h == nil || !f.full {
			err := f.WritableFile.Sync()
			if err == nil {
				f.full = true
			}
			f.fullMu.Unlock()
			if err != nil {
				return fmt.Errorf("fsync raft log segment: %w", err)
			}
			return nil
		}
		f.fullMu.Unlock()
	}
	if err := f.h[lane].Sync(); err != nil {
		return fmt.Errorf("fsync raft log segment: %w", err)
	}
	return nil
}

func (f *deferredFile) isFull() bool {
	f.fullMu.Lock()
	defer f.fullMu.Unlock()
	return f.full
}

// Sync is called by raft-wal after every append. With FsyncInterval, and
// for a lease-only append or the leader's own with FsyncAlways, the write
// is in the OS's page cache and the fsync comes later. Any other append
// with FsyncAlways runs a round, which syncs every segment with unsynced
// writes, so that the leases before it, even in a segment sealed since,
// reach the disk with it: the log on disk stays a prefix of the log. After
// a failed fsync it fails, so raft stops counting this node's log as
// written.
func (f *deferredFile) Sync() error {
	if p := f.s.failed.Load(); p != nil {
		return *p
	}
	if f.s.mode == FsyncInterval || f.s.deferring.Load() {
		return nil
	}
	return f.s.syncRound()
}

// Close syncs the file, takes it out of the rounds, and closes it once no
// round begun before can still be fsyncing it.
func (f *deferredFile) Close() error {
	serr := f.s.syncSegments()
	f.s.rmu.Lock()
	delete(f.s.files, f)
	last := f.s.last
	f.s.rmu.Unlock()
	if last != nil {
		<-last.done
	}
	return errors.Join(serr, f.closeHandles(), f.WritableFile.Close())
}

func (f *deferredFile) closeHandles() error {
	var errs []error
	for _, h := range f.h {
		errs = append(errs, h.Close())
	}
	return errors.Join(errs...)
}
