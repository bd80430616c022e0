package cluster

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	walfs "github.com/hashicorp/raft-wal/fs"
	waltypes "github.com/hashicorp/raft-wal/types"

	"github.com/queen-mq/queen/internal/state"
)

// writeSizeVFS is countingVFS recording the largest single write to a
// segment file: raft-wal writes each append's buffer at once.
type writeSizeVFS struct {
	*countingVFS
	largest atomic.Int64
}

func (v *writeSizeVFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	f, err := v.countingVFS.Create(dir, name, size)
	return &writeSizeFile{WritableFile: f, v: v}, err
}

func (v *writeSizeVFS) OpenWriter(dir, name string) (waltypes.WritableFile, error) {
	f, err := v.countingVFS.OpenWriter(dir, name)
	return &writeSizeFile{WritableFile: f, v: v}, err
}

type writeSizeFile struct {
	waltypes.WritableFile
	v *writeSizeVFS
}

func (f *writeSizeFile) WriteAt(p []byte, off int64) (int, error) {
	for {
		l := f.v.largest.Load()
		if int64(len(p)) <= l || f.v.largest.CompareAndSwap(l, int64(len(p))) {
			break
		}
	}
	return f.WritableFile.WriteAt(p, off)
}

// bigEntry is a raft log entry holding a push of size random bytes.
func bigEntry(rng *rand.Rand, i uint64, size int) *walRecord {
	payload := make([]byte, size)
	for j := range payload {
		payload[j] = 'a' + byte(rng.Intn(26))
	}
	b, err := state.EncodeEntry(&state.Entry{Time: 1, Cmds: []state.Command{&state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: fmt.Sprint(i), Payload: payload}}}}})
	if err != nil {
		panic(err)
	}
	return &walRecord{Index: i, Term: 1, Type: walCommand, Data: wrapEntry(nil, b)}
}

// Under always, one append of 4 MB is written as raft-wal appends of about
// 1 MiB each (no segment writer's buffer grows to the whole), with one
// fsync, and the log reopens with every entry whole.
func TestLargeAppendWrittenInChunksWithOneFsync(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	dir := t.TempDir()
	v := &writeSizeVFS{countingVFS: &countingVFS{VFS: walfs.New()}}
	s := newLogSyncer(FsyncAlways, time.Hour, quietLogger())
	s.walVFS = v
	wal, err := s.openWAL(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	log := &syncedLog{WAL: wal, s: s}
	if err := log.StoreLogs([]*walRecord{durableEntry(1)}); err != nil {
		t.Fatal(err)
	}
	var ents []*walRecord
	for i := uint64(2); i <= 41; i++ {
		ents = append(ents, bigEntry(rng, i, 100<<10))
	}
	before := v.syncs.Load()
	v.largest.Store(0)
	if err := log.StoreLogs(ents); err != nil {
		t.Fatal(err)
	}
	if got := v.syncs.Load() - before; got != 1 {
		t.Errorf("%d fsyncs for one append; want 1", got)
	}
	if got := v.largest.Load(); got > 1<<20+64<<10 {
		t.Errorf("the largest write to a segment was %d bytes; want at most about 1 MiB (the append in chunks)", got)
	}
	if got := s.Synced(); got != 41 {
		t.Errorf("synced = %d after the append; want 41", got)
	}
	t.Logf("largest write %d bytes, fsyncs %d", v.largest.Load(), v.syncs.Load()-before)
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	wal.Close()

	s2 := newLogSyncer(FsyncAlways, time.Hour, quietLogger())
	wal2, err := s2.openWAL(dir, 0)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer wal2.Close()
	defer s2.close()
	if last, _ := wal2.LastIndex(); last != 41 {
		t.Fatalf("the log reopens at %d; want 41", last)
	}
	var l walRecord
	for _, e := range ents {
		if err := wal2.GetLog(e.Index, &l); err != nil {
			t.Fatalf("read %d after reopen: %v", e.Index, err)
		}
		if !bytes.Equal(l.Data, e.Data) {
			t.Fatalf("entry %d reads back %d bytes, not the %d written", e.Index, len(l.Data), len(e.Data))
		}
	}
}

// A log whose entries outgrow SnapshotLogBytes gets a snapshot on every
// node without waiting for the interval or for SnapshotThreshold entries,
// and is compacted to at most TrailingLogBytes behind it.
func TestSnapshotWhenLogBytesExceedBudget(t *testing.T) {
	const snapBytes, trailBytes = 1 << 20, 256 << 10
	tc := startClusterWith(t, 3, func(_ int, c *Config) {
		c.SnapshotLogBytes, c.TrailingLogBytes = snapBytes, trailBytes
		c.SnapshotInterval = time.Hour
		c.WALSegmentSize = 128 << 10
	})
	l := tc.leader()
	ctx := ctxT(t, 60*time.Second)
	payload := []byte(`"` + strings.Repeat("x", 60<<10) + `"`)
	const pushes = 64 // 3.8 MiB
	for i := 0; i < pushes; i++ {
		v, err := l.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: fmt.Sprintf("t%d", i), Payload: payload}}}, 64)
		if err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
		if r, ok := v.(*state.PushResult); !ok || r.Err != nil {
			t.Fatalf("push %d: %T %+v", i, v, v)
		}
	}
	for _, n := range tc.nodes {
		deadline := time.Now().Add(20 * time.Second)
		for {
			si := n.logs.snapshotIndex()
			first, _ := n.logs.FirstIndex()
			kept := n.logs.bytesBetween(first-1, si)
			since := n.logs.bytesBetween(si, n.logs.lastIndex())
			walFirst, _ := n.logs.wal.FirstIndex()
			if si > 0 && first > 1 && walFirst > 1 && kept <= trailBytes && since <= snapBytes+uint64(len(payload))+1024 {
				t.Logf("%s: snapshot at %d, log from %d (raft-wal's from %d) to %d, %d bytes behind the snapshot, %d after", n.ID(), si, first, walFirst, n.logs.lastIndex(), kept, since)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: snapshot at %d, log from %d (raft-wal's from %d) to %d, %d bytes behind the snapshot (want at most %d), %d after (want about %d at most)", n.ID(), si, first, walFirst, n.logs.lastIndex(), kept, trailBytes, since, snapBytes)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	rd := l.Store().Reader()
	defer rd.Close()
	if qi, ok := rd.Queue("default", "q"); !ok || qi.Total != pushes {
		t.Fatalf("queue q %v with %d messages, want %d", ok, qi.Total, pushes)
	}
}

// A byte budget out of range is refused with its setting named.
func TestLogBytesSettingRefusesBadValues(t *testing.T) {
	const name = "snapshot-log-bytes (QUEEN_SNAPSHOT_LOG_BYTES)"
	for _, v := range []int64{-1, 0, 1000, MaxLogBytes + 1} {
		if _, err := LogBytesSetting(name, v); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("LogBytesSetting(%d) = %v; want an error naming %s", v, err, name)
		}
	}
	if got, err := LogBytesSetting(name, 256<<20); err != nil || got != 256<<20 {
		t.Errorf("LogBytesSetting(256 MiB) = %d, %v", got, err)
	}
}
