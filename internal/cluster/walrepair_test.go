package cluster

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	waltypes "github.com/hashicorp/raft-wal/types"
)

// refusingMeta is raft-wal's metadata store refusing its commits once
// armed: the rotation that follows a segment's seal then records nothing,
// as when the process stops between the seal and the rotation.
type refusingMeta struct {
	waltypes.MetaStore
	refuse atomic.Bool
}

func (m *refusingMeta) CommitState(st waltypes.PersistentState) error {
	if m.refuse.Load() {
		return errors.New("refused by the test")
	}
	return m.MetaStore.CommitState(st)
}

// A segment sealed by an append whose rotation was never recorded (the
// file sealed, the metadata calling it the open tail) is finished when the
// log opens: the log holds every entry written, and takes appends again
// across further rotations. raft-wal alone reopens such a tail and refuses
// every append to it ("segment is sealed").
func TestSealedTailReopens(t *testing.T) {
	for _, mode := range []FsyncMode{FsyncAlways, FsyncInterval} {
		t.Run(string(mode), func(t *testing.T) {
			dir := t.TempDir()
			const segSize = 64 << 10
			payload := func(i uint64) string { return fmt.Sprintf("entry %d %0*d", i, int(i%2000), 0) }
			record := func(i uint64) []*walRecord {
				return []*walRecord{{Index: i, Term: 1, Type: walCommand, Data: []byte(payload(i))}}
			}

			meta := &refusingMeta{MetaStore: &metadb.BoltMetaDB{}}
			s := newLogSyncer(mode, 10*time.Second, quietLogger())
			s.walMeta = meta
			wal, err := s.openWAL(dir, segSize)
			if err != nil {
				t.Fatal(err)
			}
			meta.refuse.Store(true)
			var written uint64
			for i := uint64(1); ; i++ {
				if i > 10_000 {
					t.Fatal("no append was refused after the first seal; raft-wal's rotation may have changed")
				}
				err := wal.StoreLogs(record(i))
				if err == nil {
					written = i
					continue
				}
				if !errors.Is(err, waltypes.ErrSealed) {
					t.Fatalf("append %d: %v; want raft-wal's ErrSealed after an unrecorded rotation", i, err)
				}
				break
			}
			if written < 2 {
				t.Fatalf("only %d entries written before the seal", written)
			}
			s.close()
			wal.Close()

			// Reopened the way a node opens its log: the rotation is finished.
			s = newLogSyncer(mode, 10*time.Second, quietLogger())
			wal, err = s.openWAL(dir, segSize)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			if last, err := wal.LastIndex(); err != nil || last != written {
				t.Fatalf("reopened log ends at %d (%v); want %d", last, err, written)
			}
			more := written + 3*segSize/1000 // several more rotations
			for i := written + 1; i <= more; i++ {
				if err := wal.StoreLogs(record(i)); err != nil {
					t.Fatalf("append %d after reopening: %v", i, err)
				}
			}
			s.close()
			wal.Close()

			// raft-wal alone now opens it with every entry as written.
			w, err := raftwal.Open(dir, raftwal.WithSegmentSize(segSize))
			if err != nil {
				t.Fatalf("open with raft-wal: %v", err)
			}
			defer w.Close()
			if last, err := w.LastIndex(); err != nil || last != more {
				t.Fatalf("log ends at %d (%v); want %d", last, err, more)
			}
			for i := uint64(1); i <= more; i++ {
				var l walRecord
				if err := w.GetLog(i, &l); err != nil || string(l.Data) != payload(i) {
					t.Fatalf("entry %d: %q, %v", i, l.Data, err)
				}
			}
			if err := w.StoreLogs(record(more + 1)); err != nil {
				t.Fatalf("append with raft-wal: %v", err)
			}
		})
	}
}
