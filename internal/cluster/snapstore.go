package cluster

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// snapStore keeps raft snapshots as directories of Pebble checkpoint files.
//
// A node's own snapshot is a checkpoint: hard links to the live store's
// files, made in milliseconds whatever the store's size, which the store
// adopts by renaming the directory. Nothing is copied. (raft's file store
// copied the whole state into one file at every snapshot: with a backlog of
// many gigabytes, that is many gigabytes written every snapshot interval.)
//
// A snapshot goes over the network (to a follower) as a stream of its files
// (snapStream) and comes in the same way: the receiving sink writes the
// files into a directory, which the state machine then links into place.
//
// Layout: snapshots/<id>/meta.json and snapshots/<id>/state/; an unfinished
// snapshot is snapshots/<id>.tmp and is removed at start.
type snapStore struct {
	dir    string
	retain int
	log    *slog.Logger

	mu      sync.Mutex
	reading map[string]int // snapshots being streamed: not reaped meanwhile
}

const (
	snapMetaFile  = "meta.json"
	snapStateDir  = "state"
	snapTmpSuffix = ".tmp"
)

// snapMeta is what meta.json holds.
type snapMeta struct {
	Format string `json:"format"` // snapFormat
	ID     string `json:"id"`
	Index  uint64 `json:"index"`
	Term   uint64 `json:"term"`
	Size   int64  `json:"size"`
	// Conf is raft's ConfState at Index (marshalled) and Members the ids
	// and addresses of its members.
	Conf    []byte            `json:"conf,omitempty"`
	Members map[uint64]member `json:"members,omitempty"`
	// Applied is the state store's own applied index in the snapshot's
	// state (at or below Index); nil when not known (catchUp then uses
	// Index).
	Applied *uint64 `json:"applied,omitempty"`
}

const snapFormat = "etcd-dir"

// snapData is what a raft snapshot carries in its Data: the snapshot's id
// (its files travel beside the message) and the members' addresses.
type snapData struct {
	ID      string            `json:"id"`
	Members map[uint64]member `json:"members,omitempty"`
}

func decodeSnapData(b []byte) (*snapData, error) {
	sd := &snapData{}
	if err := json.Unmarshal(b, sd); err != nil || sd.ID == "" || sd.ID != filepath.Base(sd.ID) {
		return nil, fmt.Errorf("snapshot data %q does not name a snapshot", b)
	}
	return sd, nil
}

// raftSnapshot is the snapshot as raft sees it.
func (m *snapMeta) raftSnapshot() *pb.Snapshot {
	b, _ := json.Marshal(&snapData{ID: m.ID, Members: m.Members})
	cs := &pb.ConfState{}
	if len(m.Conf) > 0 {
		_ = proto.Unmarshal(m.Conf, cs)
	}
	return &pb.Snapshot{Data: b, Metadata: &pb.SnapshotMetadata{Index: new(m.Index), Term: new(m.Term), ConfState: cs}}
}

func newSnapStore(dataDir string, retain int, log *slog.Logger) (*snapStore, error) {
	dir := filepath.Join(dataDir, "snapshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create snapshot dir %s: %w", dir, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list snapshot dir %s: %w", dir, err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), snapTmpSuffix) {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return &snapStore{dir: dir, retain: max(retain, 1), log: log, reading: map[string]int{}}, nil
}

// Create starts a snapshot; the sink takes either a checkpoint directory
// (adopt) or a snapshot stream (Write). An empty id makes a new one.
func (s *snapStore) Create(id string, index, term uint64, conf []byte, members map[uint64]member) (*snapSink, error) {
	var tmp string
	if id != "" {
		if id != filepath.Base(id) || strings.HasSuffix(id, snapTmpSuffix) {
			return nil, fmt.Errorf("create snapshot: bad id %q", id)
		}
		tmp = filepath.Join(s.dir, id+snapTmpSuffix)
		os.RemoveAll(tmp)
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return nil, fmt.Errorf("create snapshot %s: %w", id, err)
		}
	} else {
		for n := 0; ; n++ {
			id = fmt.Sprintf("%d-%d-%d", term, index, time.Now().UnixMilli())
			if n > 0 { // two snapshots of one index in one millisecond
				id += fmt.Sprintf("-%d", n)
			}
			tmp = filepath.Join(s.dir, id+snapTmpSuffix)
			err := os.Mkdir(tmp, 0o755)
			if err == nil {
				break
			}
			if !os.IsExist(err) || n == 100 {
				return nil, fmt.Errorf("create snapshot %s: %w", id, err)
			}
		}
	}
	return &snapSink{store: s, tmp: tmp, meta: snapMeta{Format: snapFormat, ID: id, Index: index, Term: term, Conf: conf, Members: members}}, nil
}

// List returns the retained snapshots, newest first.
func (s *snapStore) List() ([]*snapMeta, error) {
	metas, err := s.list()
	if err != nil {
		return nil, err
	}
	if len(metas) > s.retain {
		metas = metas[:s.retain]
	}
	return metas, nil
}

func (s *snapStore) list() ([]*snapMeta, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list snapshots in %s: %w", s.dir, err)
	}
	var metas []*snapMeta
	for _, e := range ents {
		if !e.IsDir() || strings.HasSuffix(e.Name(), snapTmpSuffix) {
			continue
		}
		m, err := s.readMeta(e.Name())
		if err != nil {
			s.log.Warn("skipping an unreadable snapshot", "id", e.Name(), "err", err)
			continue
		}
		if m.Format != snapFormat {
			continue
		}
		metas = append(metas, m)
	}
	sort.Slice(metas, func(i, j int) bool {
		a, b := metas[i], metas[j]
		if a.Term != b.Term {
			return a.Term > b.Term
		}
		if a.Index != b.Index {
			return a.Index > b.Index
		}
		return a.ID > b.ID
	})
	return metas, nil
}

func (s *snapStore) readMeta(id string) (*snapMeta, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, id, snapMetaFile))
	if err != nil {
		return nil, err
	}
	m := &snapMeta{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", snapMetaFile, err)
	}
	return m, nil
}

// Open streams a snapshot's files (see streamMagic).
func (s *snapStore) Open(id string) (*snapMeta, io.ReadCloser, error) {
	m, err := s.readMeta(id)
	if err != nil {
		return nil, nil, fmt.Errorf("open snapshot %s: %w", id, err)
	}
	dir := filepath.Join(s.dir, id, snapStateDir)
	files, size, err := streamFiles(id, dir)
	if err != nil {
		return nil, nil, fmt.Errorf("open snapshot %s: %w", id, err)
	}
	if size != m.Size {
		return nil, nil, fmt.Errorf("open snapshot %s: its files make %d bytes, its meta says %d", id, size, m.Size)
	}
	s.mu.Lock()
	s.reading[id]++
	s.mu.Unlock()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeStream(pw, id, dir, files)) }()
	return m, &snapReader{PipeReader: pr, done: func() {
		s.mu.Lock()
		if s.reading[id]--; s.reading[id] <= 0 {
			delete(s.reading, id)
		}
		s.mu.Unlock()
	}}, nil
}

// noteApplied records in a snapshot's meta.json the applied index of its
// state, learnt once it was installed (a snapshot received from a leader).
func (s *snapStore) noteApplied(id string, applied uint64) error {
	m, err := s.readMeta(id)
	if err != nil {
		return err
	}
	if m.Applied != nil {
		return nil
	}
	m.Applied = &applied
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.dir, id)
	tmp := filepath.Join(dir, snapMetaFile+snapTmpSuffix)
	if err := writeFileSync(tmp, b); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, snapMetaFile)); err != nil {
		return err
	}
	return syncDir(dir)
}

// snapReader streams a snapshot; Close lets the store reap it again.
type snapReader struct {
	*io.PipeReader
	once sync.Once
	done func()
}

func (r *snapReader) Close() error {
	err := r.PipeReader.Close()
	r.once.Do(r.done)
	return err
}

// reap removes all but the newest retained snapshots.
func (s *snapStore) reap() {
	metas, err := s.list()
	if err != nil {
		s.log.Warn("listing snapshots to remove old ones failed", "err", err)
		return
	}
	for i := s.retain; i < len(metas); i++ {
		s.mu.Lock()
		busy := s.reading[metas[i].ID] > 0
		s.mu.Unlock()
		if busy {
			continue // being sent; a later snapshot removes it
		}
		if err := os.RemoveAll(filepath.Join(s.dir, metas[i].ID)); err != nil {
			s.log.Warn("removing an old snapshot failed", "id", metas[i].ID, "err", err)
		}
	}
}

// snapSink receives one snapshot.
type snapSink struct {
	store   *snapStore
	tmp     string
	meta    snapMeta
	adopted bool
	pw      *io.PipeWriter
	recvErr chan error
	closed  bool
}

func (k *snapSink) ID() string { return k.meta.ID }

// adopt takes a checkpoint directory, whose state is at applied, as the
// snapshot's state by renaming it.
func (k *snapSink) adopt(dir string, applied uint64) error {
	if k.adopted || k.pw != nil {
		return errors.New("snapshot sink already has its state")
	}
	if err := os.Rename(dir, filepath.Join(k.tmp, snapStateDir)); err != nil {
		return fmt.Errorf("adopt checkpoint %s: %w", dir, err)
	}
	k.adopted = true
	k.meta.Applied = &applied
	return nil
}

// Write takes the snapshot as a stream, unpacked as it arrives.
func (k *snapSink) Write(p []byte) (int, error) {
	if k.adopted {
		return 0, errors.New("snapshot sink already has its state")
	}
	if k.pw == nil {
		pr, pw := io.Pipe()
		k.pw, k.recvErr = pw, make(chan error, 1)
		dst := filepath.Join(k.tmp, snapStateDir)
		go func() {
			err := receiveStream(pr, dst)
			pr.CloseWithError(err) // unblocks a writer if the stream was bad
			k.recvErr <- err
		}()
	}
	return k.pw.Write(p)
}

// Close finishes the snapshot: the files are synced, meta.json written and
// the directory renamed into place. Then the older snapshots beyond the
// ones retained are removed.
func (k *snapSink) Close() error {
	if err := k.closeKeep(); err != nil {
		return err
	}
	k.store.reap()
	return nil
}

// closeKeep finishes the snapshot as Close does and leaves the older
// snapshots to the caller (snapStore.reap).
func (k *snapSink) closeKeep() error {
	if k.closed {
		return nil
	}
	k.closed = true
	if k.pw != nil {
		k.pw.Close()
		if err := <-k.recvErr; err != nil {
			os.RemoveAll(k.tmp)
			return fmt.Errorf("receive snapshot %s: %w", k.meta.ID, err)
		}
	} else if !k.adopted {
		os.RemoveAll(k.tmp)
		return fmt.Errorf("snapshot %s: closed without any state", k.meta.ID)
	}
	if err := k.finish(); err != nil {
		os.RemoveAll(k.tmp)
		return fmt.Errorf("finish snapshot %s: %w", k.meta.ID, err)
	}
	return nil
}

func (k *snapSink) finish() error {
	state := filepath.Join(k.tmp, snapStateDir)
	_, size, err := streamFiles(k.meta.ID, state)
	if err != nil {
		return err
	}
	k.meta.Size = size
	if err := syncDir(state); err != nil {
		return err
	}
	b, err := json.Marshal(&k.meta)
	if err != nil {
		return err
	}
	if err := writeFileSync(filepath.Join(k.tmp, snapMetaFile), b); err != nil {
		return err
	}
	if err := syncDir(k.tmp); err != nil {
		return err
	}
	// The same snapshot received again (its first copy was refused by
	// raft, or the transfer was retried): the new copy replaces it.
	if err := os.RemoveAll(filepath.Join(k.store.dir, k.meta.ID)); err != nil {
		return err
	}
	if err := os.Rename(k.tmp, filepath.Join(k.store.dir, k.meta.ID)); err != nil {
		return err
	}
	return syncDir(k.store.dir)
}

func (k *snapSink) Cancel() error {
	if k.closed {
		return nil
	}
	k.closed = true
	if k.pw != nil {
		k.pw.CloseWithError(errors.New("snapshot cancelled"))
		<-k.recvErr
	}
	return os.RemoveAll(k.tmp)
}

// The snapshot stream: streamMagic; the snapshot's id (a big-endian uint16
// length, then the bytes), so that a node restoring a snapshot it holds
// itself can link its files instead of reading them; then for each file a
// uint16 name length, the name, a uint64 size and the contents; a zero name
// length ends it. Its length follows from the file sizes alone, which raft
// needs before it sends a snapshot.
var streamMagic = []byte("queen-snapshot-1\n")

type streamFile struct {
	name string
	size int64
}

// streamFiles lists a snapshot directory's files (it is flat) and the
// length of their stream.
func streamFiles(id, dir string) ([]streamFile, int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	total := int64(len(streamMagic)) + 2 + int64(len(id)) + 2
	var files []streamFile
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return nil, 0, fmt.Errorf("snapshot entry %s is not a regular file", e.Name())
		}
		info, err := e.Info()
		if err != nil {
			return nil, 0, err
		}
		files = append(files, streamFile{e.Name(), info.Size()})
		total += 2 + int64(len(e.Name())) + 8 + info.Size()
	}
	return files, total, nil
}

func writeStream(w io.Writer, id, dir string, files []streamFile) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	bw.Write(streamMagic)
	var hdr [8]byte
	binary.BigEndian.PutUint16(hdr[:2], uint16(len(id)))
	bw.Write(hdr[:2])
	bw.WriteString(id)
	for _, f := range files {
		binary.BigEndian.PutUint16(hdr[:2], uint16(len(f.name)))
		bw.Write(hdr[:2])
		bw.WriteString(f.name)
		binary.BigEndian.PutUint64(hdr[:], uint64(f.size))
		bw.Write(hdr[:])
		fh, err := os.Open(filepath.Join(dir, f.name))
		if err != nil {
			return err
		}
		n, err := io.Copy(bw, io.LimitReader(fh, f.size))
		fh.Close()
		if err != nil {
			return err
		}
		if n != f.size {
			return fmt.Errorf("snapshot file %s shrank from %d to %d bytes", f.name, f.size, n)
		}
	}
	bw.Write([]byte{0, 0})
	return bw.Flush()
}

// openStream reads a snapshot stream's header and returns the snapshot's
// id; ok is false when the stream is a tar archive instead (raft's file
// store, or a node of an earlier version).
func openStream(br *bufio.Reader) (id string, ok bool, err error) {
	head, err := br.Peek(len(streamMagic))
	if err != nil {
		return "", false, fmt.Errorf("snapshot stream: %w", noEOF(err))
	}
	if !bytes.Equal(head, streamMagic) {
		return "", false, nil
	}
	br.Discard(len(streamMagic))
	b, err := readName(br)
	if err != nil {
		return "", false, err
	}
	return string(b), true, nil
}

func readName(br *bufio.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(br, l[:]); err != nil {
		return nil, fmt.Errorf("snapshot stream: %w", noEOF(err))
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, fmt.Errorf("snapshot stream: %w", noEOF(err))
	}
	return b, nil
}

// receiveFiles writes the files of a snapshot stream, after its header,
// into dir, syncing each.
func receiveFiles(br *bufio.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var hdr [8]byte
	for {
		name, err := readName(br)
		if err != nil {
			return err
		}
		if len(name) == 0 {
			return syncDir(dir)
		}
		if n := string(name); n != filepath.Base(n) || n == "." || n == ".." {
			return fmt.Errorf("snapshot stream: bad file name %q", n)
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return fmt.Errorf("snapshot stream: %w", noEOF(err))
		}
		size := int64(binary.BigEndian.Uint64(hdr[:]))
		if size < 0 {
			return fmt.Errorf("snapshot stream: bad size for %s", name)
		}
		fh, err := os.OpenFile(filepath.Join(dir, string(name)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		n, err := io.Copy(fh, io.LimitReader(br, size))
		if err == nil && n != size {
			err = fmt.Errorf("snapshot stream: %s cut short at %d of %d bytes", name, n, size)
		}
		if err == nil {
			err = fh.Sync()
		}
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}

// receiveStream writes a snapshot stream, or a tar archive, into dir.
func receiveStream(r io.Reader, dir string) error {
	br := bufio.NewReaderSize(r, 1<<20)
	_, ok, err := openStream(br)
	if err != nil {
		return err
	}
	if !ok {
		return untar(br, dir)
	}
	return receiveFiles(br, dir)
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// linkFiles makes dst hold the files of the snapshot directory src. Table
// files are immutable and get hard links, where the file system allows;
// the others (the MANIFEST that Pebble appends to, OPTIONS, markers) are
// copied, so that the store never writes into a snapshot's files.
func linkFiles(id, src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	files, _, err := streamFiles(id, src)
	if err != nil {
		return err
	}
	for _, f := range files {
		from, to := filepath.Join(src, f.name), filepath.Join(dst, f.name)
		if immutableFile(f.name) {
			if err := os.Link(from, to); err == nil {
				continue
			}
		}
		if err := copyFile(from, to); err != nil {
			return err
		}
	}
	return syncDir(dst)
}

// immutableFile reports whether Pebble never writes to a file once made:
// its tables and blob files.
func immutableFile(name string) bool {
	return strings.HasSuffix(name, ".sst") || strings.HasSuffix(name, ".blob")
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
