package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/raft-wal/segment"
	waltypes "github.com/hashicorp/raft-wal/types"
)

// finishSealedTail completes a segment rotation that raft-wal began and
// did not record, before the log in dir is opened.
//
// raft-wal (v0.4.2) seals a full segment inside the append that fills it
// (the index block is written with that append's entries) and records the
// seal in its metadata afterwards, from a goroutine of its own: the
// sealed segment marked sealed and a new tail segment added. A process
// that stops between the two (kill -9, a Close that wins the race for the
// write lock, a failed metadata commit) leaves a tail segment that the
// metadata calls open and whose file is sealed. raft-wal reopens it as
// the tail and refuses every append to it ("segment is sealed"), so the
// node could never write again.
//
// Every entry in such a segment is committed (the seal is the append's
// last frame before its commit frame), so the rotation can be finished as
// raft-wal would have: the tail marked sealed through its last entry, and
// a new empty tail segment after it. The new segment's file is created by
// raft-wal's Open (a tail whose file is missing is created).
//
// meta must be the bare metadata store (not syncedMeta: its Load declares
// the codec, which raft-wal checks later); vfs the segments' file system
// (not deferredVFS: the segment read here is closed again at once).
func finishSealedTail(dir string, meta waltypes.MetaStore, vfs waltypes.VFS, log *slog.Logger) error {
	st, err := meta.Load(dir)
	if err != nil {
		return fmt.Errorf("read the raft log's metadata: %w", err)
	}
	n := len(st.Segments)
	if n == 0 {
		return nil
	}
	tail := st.Segments[n-1]
	if !tail.SealTime.IsZero() {
		return nil
	}
	w, err := segment.NewFiler(dir, vfs).RecoverTail(tail)
	if errors.Is(err, os.ErrNotExist) {
		return nil // raft-wal creates it
	}
	if err != nil {
		return fmt.Errorf("read the raft log's tail segment %d: %w", tail.ID, err)
	}
	sealed, indexStart, err := w.Sealed()
	last := w.LastIndex()
	if cerr := w.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("read the raft log's tail segment %d: %w", tail.ID, err)
	}
	if !sealed || last < tail.BaseIndex {
		return nil
	}
	now := time.Now()
	tail.SealTime = now
	tail.MaxIndex = last
	tail.IndexStart = indexStart
	// Opened as raft-wal will open a sealed segment (through its index
	// block), it must read its first and last entries; else the seal is
	// not whole (a power cut inside the sealing append) and the log is left
	// as raft-wal would leave it.
	if err := readsSealed(dir, vfs, tail); err != nil {
		log.Error("raft log: the tail segment is sealed but does not read as sealed; raft-wal will refuse appends to it",
			"segment", tail.ID, "last_index", last, "err", err)
		return nil
	}
	st.Segments[n-1] = tail
	st.Segments = append(st.Segments, waltypes.SegmentInfo{
		ID:         st.NextSegmentID,
		BaseIndex:  last + 1,
		MinIndex:   last + 1,
		SizeLimit:  tail.SizeLimit,
		Codec:      tail.Codec,
		CreateTime: now,
	})
	st.NextSegmentID++
	if err := meta.CommitState(st); err != nil {
		return fmt.Errorf("record the raft log's sealed segment %d: %w", tail.ID, err)
	}
	log.Warn("raft log: finished a segment rotation the last run did not record",
		"segment", tail.ID, "last_index", last)
	return nil
}

// readsSealed opens info's segment as a sealed one and reads its first and
// last entries.
func readsSealed(dir string, vfs waltypes.VFS, info waltypes.SegmentInfo) error {
	r, err := segment.NewFiler(dir, vfs).Open(info)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, i := range []uint64{info.MinIndex, info.MaxIndex} {
		b, err := r.GetLog(i)
		if err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
		b.Close()
	}
	return nil
}
