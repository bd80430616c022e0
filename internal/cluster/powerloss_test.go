package cluster

import (
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	raftwal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	waltypes "github.com/hashicorp/raft-wal/types"
)

// lossyVFS is the OS's file system with a power loss: crash puts back, in
// every file, what each write since that file's last fsync overwrote.
type lossyVFS struct {
	waltypes.VFS
	mu      sync.Mutex
	files   []*lossyFile
	crashed bool
}

type lossyFile struct {
	waltypes.WritableFile
	v    *lossyVFS
	undo []undoRec // writes since the last fsync, oldest first
}

type undoRec struct {
	off int64
	old []byte
}

func (v *lossyVFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return v.track(f), nil
}

func (v *lossyVFS) OpenWriter(dir, name string) (waltypes.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return v.track(f), nil
}

func (v *lossyVFS) track(f waltypes.WritableFile) *lossyFile {
	lf := &lossyFile{WritableFile: f, v: v}
	v.mu.Lock()
	v.files = append(v.files, lf)
	v.mu.Unlock()
	return lf
}

func (f *lossyFile) WriteAt(p []byte, off int64) (int, error) {
	f.v.mu.Lock()
	defer f.v.mu.Unlock()
	if f.v.crashed {
		return len(p), nil
	}
	old := make([]byte, len(p))
	n, _ := f.WritableFile.ReadAt(old, off)
	f.undo = append(f.undo, undoRec{off: off, old: old[:n]})
	return f.WritableFile.WriteAt(p, off)
}

func (f *lossyFile) Sync() error {
	f.v.mu.Lock()
	defer f.v.mu.Unlock()
	if f.v.crashed {
		return nil
	}
	f.undo = nil
	return f.WritableFile.Sync()
}

// lossyMeta is raft-wal's metadata store, which commits nothing after the
// power is cut (raft-wal rotates segments in the background).
type lossyMeta struct {
	waltypes.MetaStore
	v *lossyVFS
}

func (m *lossyMeta) CommitState(st waltypes.PersistentState) error {
	m.v.mu.Lock()
	defer m.v.mu.Unlock()
	if m.v.crashed {
		return errors.New("the power is off")
	}
	return m.MetaStore.CommitState(st)
}

// crash loses every unsynced write; later writes and syncs do nothing.
func (v *lossyVFS) crash() (lost int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.crashed = true
	for _, f := range v.files {
		for i := len(f.undo) - 1; i >= 0; i-- {
			u := f.undo[i]
			f.WritableFile.WriteAt(u.old, u.off)
			lost++
		}
		f.undo = nil
	}
	return lost
}

// A power loss under interval loses at most the appends after the last
// sync: the log reopens whole (metadata never names unsynced segment data,
// even across segment rotations), it holds every entry through the synced
// index, and no entry in part.
func TestIntervalPowerLossKeepsASyncedPrefix(t *testing.T) {
	for trial := 0; trial < 5; trial++ {
		seed := time.Now().UnixNano()
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewSource(seed))
			dir := t.TempDir()
			s, lossy, wal := openLossyLog(t, FsyncInterval, dir)
			next := uint64(1)
			payload := func(i uint64) string { return fmt.Sprintf("entry %d %0*d", i, int(i%3000), 0) }
			var synced uint64
			for round := 0; round < 20; round++ {
				var logs []*walRecord
				for k := rng.Intn(40) + 1; k > 0; k-- {
					logs = append(logs, &walRecord{Index: next, Term: 1, Type: walCommand, Data: []byte(payload(next))})
					next++
				}
				if err := wal.StoreLogs(logs); err != nil {
					t.Fatal(err)
				}
				if rng.Intn(8) == 0 {
					if err := s.syncRound(); err != nil {
						t.Fatal(err)
					}
					synced = s.Synced()
				}
			}
			written := next - 1
			lost := lossy.crash()
			s.close()
			wal.Close()

			t.Logf("written %d, synced %d, %d writes lost", written, synced, lost)
			checkReopenedLog(t, dir, synced, written, payload)
		})
	}
}

// checkReopenedLog reopens the raft log in dir after a simulated power
// loss: it must end between synced (everything synced survives) and
// written (nothing appears that was not written), and hold each entry's
// data as want gives it.
func checkReopenedLog(t *testing.T, dir string, synced, written uint64, want func(uint64) string) {
	t.Helper()
	wal, err := raftwal.Open(dir)
	if err != nil {
		t.Fatalf("reopen after the power loss: %v", err)
	}
	defer wal.Close()
	last, err := wal.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the log reopens at %d", last)
	if last < synced || last > written {
		t.Fatalf("log reopens at %d; want between the synced index %d and the written %d", last, synced, written)
	}
	for i := uint64(1); i <= last; i++ {
		var l walRecord
		if err := wal.GetLog(i, &l); err != nil || string(l.Data) != want(i) {
			t.Fatalf("entry %d after the power loss: %q, %v", i, l.Data, err)
		}
	}
}

// openLossyLog opens a raft log in dir under mode whose segment files and
// metadata can lose their unsynced writes (lossy.crash), with segments
// small enough to rotate several times in a test.
func openLossyLog(t *testing.T, mode FsyncMode, dir string) (*logSyncer, *lossyVFS, *raftwal.WAL) {
	t.Helper()
	lossy := &lossyVFS{VFS: walfs.New()}
	s := newLogSyncer(mode, 10*time.Second, quietLogger())
	s.walVFS = lossy
	s.walMeta = &lossyMeta{MetaStore: &metadb.BoltMetaDB{}, v: lossy}
	wal, err := s.openWAL(dir, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	return s, lossy, wal
}
