package cluster

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

var testMembers = map[uint64]member{raftID("n1"): {ID: "n1", Addr: "127.0.0.1:1"}}

// fakeCheckpoint makes a directory shaped like a Pebble checkpoint.
func fakeCheckpoint(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{"000007.sst": make([]byte, 300_000), "000009.sst": make([]byte, 5),
		"MANIFEST-000010": []byte("manifest"), "OPTIONS-000011": []byte("options"), "marker.manifest.000001.MANIFEST-000010": nil}
	rand.Read(files["000007.sst"])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func sameFiles(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(want) {
		t.Fatalf("%s holds %d files, want %d", dir, len(ents), len(want))
	}
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s/%s: %d bytes (err %v), want %d", dir, name, len(got), err, len(b))
		}
	}
}

func readAll(t *testing.T, s *snapStore, id string) (*snapMeta, []byte) {
	t.Helper()
	meta, rc, err := s.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return meta, b
}

// TestSnapStoreAdoptSendReceive: a node's snapshot adopts its checkpoint
// directory; the stream it sends is exactly as long as its meta says (raft
// refuses it otherwise), and a receiving store rebuilds the same files.
func TestSnapStoreAdoptSendReceive(t *testing.T) {
	root := t.TempDir()
	files := fakeCheckpoint(t, filepath.Join(root, "cp"))
	s, err := newSnapStore(filepath.Join(root, "a"), 2, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	sink, err := s.Create("", 10, 2, nil, testMembers)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.adopt(filepath.Join(root, "cp"), 0); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cp")); !os.IsNotExist(err) {
		t.Fatalf("the checkpoint directory is still there after adoption: %v", err)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Index != 10 || list[0].Term != 2 || len(list[0].Members) != 1 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	meta, stream := readAll(t, s, sink.ID())
	if int64(len(stream)) != meta.Size {
		t.Fatalf("the stream has %d bytes, its meta says %d", len(stream), meta.Size)
	}
	sameFiles(t, filepath.Join(s.dir, sink.ID(), snapStateDir), files)

	// A follower receives it as the transport does: Create, Write, Close.
	f, err := newSnapStore(filepath.Join(root, "b"), 2, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	fsink, err := f.Create(meta.ID, meta.Index, meta.Term, meta.Conf, meta.Members)
	if err != nil {
		t.Fatal(err)
	}
	for rest := stream; len(rest) > 0; { // in uneven pieces
		n := min(len(rest), 7777)
		if _, err := fsink.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	if err := fsink.Close(); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, filepath.Join(f.dir, fsink.ID(), snapStateDir), files)
	if fmeta, again := readAll(t, f, fsink.ID()); fmeta.Size != int64(len(again)) || fmeta.Size != meta.Size-int64(len(meta.ID))+int64(len(fmeta.ID)) {
		t.Fatalf("re-sent stream: %d bytes, meta %d, first store's %d", len(again), fmeta.Size, meta.Size)
	}

	// The state machine links a snapshot it holds: tables become hard
	// links, files Pebble writes to are copies.
	fm := &fsm{snaps: f}
	_, st, err := f.Open(fsink.ID())
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "restored")
	how, _, err := fm.unpack(st, out)
	st.Close()
	if err != nil || !strings.HasPrefix(how, "local snapshot") {
		t.Fatalf("unpack: %q, %v", how, err)
	}
	sameFiles(t, out, files)
	for name := range files {
		a, _ := os.Stat(filepath.Join(out, name))
		b, _ := os.Stat(filepath.Join(f.dir, fsink.ID(), snapStateDir, name))
		if linked := os.SameFile(a, b); linked != immutableFile(name) {
			t.Fatalf("%s: linked=%v, want linked only for tables", name, linked)
		}
	}
	// Without the local copy it reads the stream.
	how, _, err = (&fsm{}).unpack(bytes.NewReader(stream), filepath.Join(root, "restored2"))
	if err != nil || how != "stream" {
		t.Fatalf("unpack from the stream: %q, %v", how, err)
	}
	sameFiles(t, filepath.Join(root, "restored2"), files)
}

// TestSnapStoreRefusesCutStream: a stream cut anywhere leaves no snapshot.
func TestSnapStoreRefusesCutStream(t *testing.T) {
	root := t.TempDir()
	fakeCheckpoint(t, filepath.Join(root, "cp"))
	s, _ := newSnapStore(filepath.Join(root, "a"), 2, quietLogger())
	sink, _ := s.Create("", 5, 1, nil, testMembers)
	sink.adopt(filepath.Join(root, "cp"), 0)
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	_, stream := readAll(t, s, sink.ID())
	f, _ := newSnapStore(filepath.Join(root, "b"), 2, quietLogger())
	for _, cut := range []int{0, 5, len(streamMagic) + 3, 100, len(stream) / 2, len(stream) - 1} {
		k, _ := f.Create("", 5, 1, nil, testMembers)
		k.Write(stream[:cut])
		if err := k.Close(); err == nil {
			t.Fatalf("a stream cut at %d of %d bytes was accepted", cut, len(stream))
		}
	}
	if list, _ := f.List(); len(list) != 0 {
		t.Fatalf("cut streams left snapshots: %+v", list)
	}
	if ents, _ := os.ReadDir(f.dir); len(ents) != 0 {
		t.Fatalf("cut streams left %d entries in %s", len(ents), f.dir)
	}
}

// TestSnapStoreNamesEverySnapshot: two snapshots of one index taken in
// the same millisecond get different ids.
func TestSnapStoreNamesEverySnapshot(t *testing.T) {
	s, _ := newSnapStore(t.TempDir(), 2, quietLogger())
	a, err1 := s.Create("", 9, 1, nil, testMembers)
	b, err2 := s.Create("", 9, 1, nil, testMembers)
	if err1 != nil || err2 != nil || a.ID() == b.ID() {
		t.Fatalf("two snapshots of one index: %v %v, ids %q %q", err1, err2, a.ID(), b.ID())
	}
	a.Cancel()
	b.Cancel()
}

// TestSnapStoreKeepsTheNewest: the store keeps its retain count.
func TestSnapStoreKeepsTheNewest(t *testing.T) {
	root := t.TempDir()
	s, _ := newSnapStore(root, 2, quietLogger())
	for i := 1; i <= 4; i++ {
		cp := filepath.Join(root, fmt.Sprintf("cp%d", i))
		fakeCheckpoint(t, cp)
		if i == 3 { // larger than the stream's buffer: read while being sent
			for _, name := range []string{"000100.sst", "000101.sst"} {
				if err := os.WriteFile(filepath.Join(cp, name), make([]byte, 3<<20), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		k, _ := s.Create("", uint64(10*i), 1, nil, testMembers)
		k.adopt(cp, 0)
		if err := k.Close(); err != nil {
			t.Fatal(err)
		}
	}
	list, _ := s.List()
	if len(list) != 2 || list[0].Index != 40 || list[1].Index != 30 {
		t.Fatalf("list: %+v", list)
	}
	if ents, _ := os.ReadDir(s.dir); len(ents) != 2 {
		t.Fatalf("%d snapshot directories on disk, want 2", len(ents))
	}
	// A snapshot being sent to a follower outlives its turn until the
	// reader is closed.
	_, rc, err := s.Open(list[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	for i := 5; i <= 6; i++ {
		cp := filepath.Join(root, fmt.Sprintf("cp%d", i))
		fakeCheckpoint(t, cp)
		k, _ := s.Create("", uint64(10*i), 1, nil, testMembers)
		k.adopt(cp, 0)
		if err := k.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading a snapshot while newer ones were taken: %v", err)
	}
	rc.Close()
	if err := receiveStream(bytes.NewReader(b), filepath.Join(root, "got2")); err != nil {
		t.Fatalf("the snapshot read during the reap is not whole: %v", err)
	}
	k, _ := s.Create("", 70, 1, nil, testMembers)
	fakeCheckpoint(t, filepath.Join(root, "cp7"))
	k.adopt(filepath.Join(root, "cp7"), 0)
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(s.dir); len(ents) != 2 {
		t.Fatalf("%d snapshot directories on disk once the reader closed, want 2", len(ents))
	}
}

// TestSnapshotLinksAndInstalls runs the real thing: a node's snapshot holds
// hard links to its store's tables (nothing copied), and a node that joins
// after the log was truncated installs it over the network.
func TestSnapshotLinksAndInstalls(t *testing.T) {
	addr := freeAddr(t)
	cfg := Config{DataDir: filepath.Join(t.TempDir(), "n1"), NodeID: "n1", RaftAddr: addr,
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger(),
		TrailingLogs: 2, SnapshotThreshold: 1 << 30, SnapshotInterval: time.Hour, WALSegmentSize: 64 << 10}
	n1, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, nodes: []*Node{n1}}
	t.Cleanup(func() {
		for _, n := range tc.nodes {
			n.Close()
		}
	})
	tc.leader()
	ctx := ctxT(t, 60*time.Second)
	payload := bytes.Repeat([]byte("x"), 1000)
	for i := 0; i < 300; i++ {
		items := make([]state.PushItem, 10)
		for j := range items {
			items[j] = state.PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", j), TxID: fmt.Sprintf("t%d-%d", i, j), Payload: []byte(fmt.Sprintf(`"%s%d"`, payload, i))}
		}
		if _, err := n1.Submit(ctx, &state.Push{Tenant: "default", Items: items}, 12000); err != nil {
			t.Fatal(err)
		}
	}
	if err := n1.snapshotNow(); err != nil {
		t.Fatal(err)
	}
	list, err := n1.fsm.snaps.List()
	if err != nil || len(list) != 1 {
		t.Fatalf("snapshots: %+v, %v", list, err)
	}
	snapDir := filepath.Join(n1.fsm.snaps.dir, list[0].ID, snapStateDir)
	linked, blobs := 0, 0
	ents, _ := os.ReadDir(snapDir)
	for _, e := range ents {
		if !immutableFile(e.Name()) {
			continue
		}
		if strings.HasSuffix(e.Name(), ".blob") {
			blobs++
		}
		a, _ := os.Stat(filepath.Join(snapDir, e.Name()))
		b, err := os.Stat(filepath.Join(cfg.DataDir, "state", e.Name()))
		if err == nil && os.SameFile(a, b) {
			linked++
		}
	}
	if linked == 0 {
		t.Fatalf("none of the snapshot's %d files is a link to the store's: the snapshot copied the state", len(ents))
	}
	// The 1 KB payloads live in blob files (state/blobs.go), which the
	// snapshot carries like tables.
	if blobs == 0 {
		t.Fatalf("the snapshot holds no blob file (files: %d)", len(ents))
	}
	if first, _ := n1.wal.FirstIndex(); first <= 1 {
		t.Fatalf("the log was not truncated behind the snapshot (first index %d): a joining node would replay it", first)
	}

	cfg2 := Config{DataDir: filepath.Join(t.TempDir(), "n2"), NodeID: "n2", RaftAddr: freeAddr(t), Join: true,
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger()}
	n2, err := Open(cfg2)
	if err != nil {
		t.Fatal(err)
	}
	tc.nodes = append(tc.nodes, n2)
	if err := n1.Join(ctx, "n2", cfg2.RaftAddr); err != nil {
		t.Fatalf("join: %v", err)
	}
	if err := n2.ReadBarrier(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n2.fsm.restores.Load(); got != 1 {
		t.Fatalf("n2 installed %d snapshots, want 1", got)
	}
	r1, r2 := n1.Store().Reader(), n2.Store().Reader()
	q1, _ := r1.Queue("default", "q")
	q2, ok := r2.Queue("default", "q")
	r1.Close()
	r2.Close()
	if !ok || q2.Total != 3000 || q1.Total != q2.Total {
		t.Fatalf("n2 holds %d messages, n1 %d, want 3000", q2.Total, q1.Total)
	}
	// Every key and value, payloads from the blob files included.
	s1, err1 := n1.Store().Checksum()
	s2, err2 := n2.Store().Checksum()
	if err1 != nil || err2 != nil || s1 != s2 {
		t.Fatalf("state checksums differ after the install: n1 %x (%v), n2 %x (%v)", s1, err1, s2, err2)
	}
	// A push after the install reaches both.
	if _, err := n1.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p0", TxID: "after", Payload: []byte(`1`)}}}, 64); err != nil {
		t.Fatal(err)
	}
	if err := n2.ReadBarrier(ctx); err != nil {
		t.Fatal(err)
	}
	r2 = n2.Store().Reader()
	q2, _ = r2.Queue("default", "q")
	r2.Close()
	if q2.Total != 3001 {
		t.Fatalf("n2 holds %d messages after one more push, want 3001", q2.Total)
	}
}
