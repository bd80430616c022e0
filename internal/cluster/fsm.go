package cluster

import (
	"archive/tar"
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/queen-mq/queen/internal/failpoint"
	"github.com/queen-mq/queen/internal/stagetime"
	"github.com/queen-mq/queen/internal/state"
)

// fsm applies committed raft entries to the state store, in one Pebble
// batch per run of entries, and takes and restores snapshots.
type fsm struct {
	store   *state.Store
	dataDir string
	snaps   *snapStore
	log     *slog.Logger
	snapSeq atomic.Uint64
	// dedup records the request ids of applied entries (dedup.go).
	dedup *dedup
	// onApply is called after every apply and restore.
	onApply func()
	// onHalt is told when the store cannot apply the log (halt.go); the
	// state machine then applies nothing more until closing is closed.
	onHalt  func(error)
	closing <-chan struct{}
	// restores counts snapshots installed from a leader.
	restores atomic.Uint64
	// restoring is held exclusively while a restore swaps the store's
	// directory; this package's own local reads (checksums) hold it shared.
	restoring sync.RWMutex
	// The slices of the last applyBatch, reused by the next (applies run
	// one at a time, under Node.applier, and no caller keeps them).
	entScratch []state.LogEntry
	idsScratch [][]reqID
	outScratch []any
}

// applyBatch applies committed entries (every entry moves the store's
// applied index; only normal entries with data hold commands). It returns
// each entry's request ids and results; ok is false when the store cannot
// apply them: the node has stopped (halt.go).
func (f *fsm) applyBatch(ents []*pb.Entry) (ids [][]reqID, out []any, ok bool) {
	if stagetime.On() {
		start := stagetime.Now()
		defer stageApplied(ents, start)
	}
	entries := reuse(f.entScratch, len(ents))
	ids = reuse(f.idsScratch, len(ents))
	for i, e := range ents {
		entries[i].Index = e.GetIndex()
		if e.GetType() == pb.EntryNormal && len(e.GetData()) > 0 {
			ids[i], entries[i].Data = unwrapEntry(e.GetData())
		}
	}
	out = reuse(f.outScratch, len(ents))
	f.entScratch, f.idsScratch, f.outScratch = entries, ids, out
	res, err := f.store.ApplyBatch(entries)
	if err != nil {
		// The store cannot keep its state in step with the log: applying
		// on would diverge. The node stops and applies nothing more; the
		// entries stay in the log and a restart applies them.
		if f.onHalt != nil {
			f.onHalt(err)
		}
		return nil, nil, false
	}
	for i := range ents {
		if res[i] != nil {
			out[i] = res[i]
		}
		if f.dedup != nil && len(ids[i]) > 0 {
			f.dedup.record(ents[i].GetIndex(), ids[i], res[i], res[i] == nil)
		}
	}
	if f.onApply != nil {
		f.onApply()
	}
	return ids, out, true
}

// reuse returns s cleared and cut to n when its capacity holds n and is not
// large (a big batch's slices are not kept), and a new slice otherwise.
func reuse[T any](s []T, n int) []T {
	if cap(s) >= n && cap(s) <= maxEntryCmds {
		s = s[:n]
		clear(s)
		return s
	}
	return make([]T, n)
}

// checkpoint cuts a Pebble checkpoint of the state, at the store's
// applied index (which it returns), into a new directory.
func (f *fsm) checkpoint() (string, uint64, error) {
	dir := filepath.Join(f.dataDir, "checkpoints", fmt.Sprintf("cp-%d-%d", os.Getpid(), f.snapSeq.Add(1)))
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", 0, fmt.Errorf("snapshot: %w", err)
	}
	os.RemoveAll(dir)
	applied, err := f.store.Checkpoint(dir)
	if err != nil {
		return "", 0, err
	}
	return dir, applied, nil
}

// Restore replaces the state with a streamed checkpoint (install.go has
// the steps and what a crash between them leaves).
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	failpoint.Hit(fpInstallStart)
	start := time.Now()
	tmp := filepath.Join(f.dataDir, restoreDirName)
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	cr := &countingReader{r: rc}
	how, localID, err := f.unpack(cr, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("restore snapshot: %w", err)
	}
	failpoint.Hit(fpInstallUnpacked)
	unpacked := time.Since(start)
	f.restoring.Lock()
	defer f.restoring.Unlock()
	if f.dedup != nil {
		f.dedup.restored()
	}
	f.restores.Add(1)
	defer func() {
		if f.onApply != nil {
			f.onApply()
		}
	}()
	swapStart := time.Now()
	if err := f.store.Replace(tmp, swapState); err != nil {
		return err
	}
	failpoint.Hit(fpInstallOpened)
	applied := f.store.AppliedIndex()
	if localID != "" {
		if err := f.snaps.noteApplied(localID, applied); err != nil {
			f.log.Warn("recording the applied index of an installed snapshot failed; the next start installs it again", "id", localID, "err", err)
		}
	}
	f.log.Info("installed a snapshot", "from", how, "read", cr.n, "unpack", unpacked.Round(time.Millisecond),
		"swap", time.Since(swapStart).Round(time.Millisecond), "applied", applied)
	return nil
}

// unpack writes a snapshot stream's state into dir. A snapshot this node
// holds itself (one it just received) is linked from its directory rather
// than read from the stream.
// It returns how, and the id of the local snapshot it used, if any.
func (f *fsm) unpack(r io.Reader, dir string) (string, string, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	id, ok, err := openStream(br)
	if err != nil {
		return "", "", err
	}
	if !ok {
		return "tar stream", "", untar(br, dir)
	}
	if f.snaps != nil && id != "" && id == filepath.Base(id) {
		local := filepath.Join(f.snaps.dir, id, snapStateDir)
		if st, err := os.Stat(local); err == nil && st.IsDir() {
			return "local snapshot " + id, id, linkFiles(id, local, dir)
		}
	}
	return "stream", "", receiveFiles(br, dir)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func untar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	dirs := []string{dir}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			for _, d := range dirs {
				if err := syncDir(d); err != nil {
					return err
				}
			}
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(filepath.FromSlash(hdr.Name))
		if strings.HasPrefix(name, "..") || filepath.IsAbs(name) {
			return fmt.Errorf("snapshot entry %q escapes the directory", hdr.Name)
		}
		path := filepath.Join(dir, name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
			dirs = append(dirs, path)
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			fh, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			if _, err := io.Copy(fh, tr); err != nil {
				fh.Close()
				return err
			}
			if err := fh.Sync(); err != nil {
				fh.Close()
				return err
			}
			if err := fh.Close(); err != nil {
				return err
			}
		}
	}
}
