package state

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/google/uuid"
)

// openWithFS opens the harness's directory again over fs, with a block
// cache too small to hold anything, so that every read reaches the files.
func (h *harness) openWithFS(fs vfs.FS) {
	h.t.Helper()
	if err := h.s.Close(); err != nil {
		h.t.Fatal(err)
	}
	s, err := Open(h.dir, Options{FS: fs, noBlockCache: true})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { s.Close() })
	h.s = s
}

// applyErr applies one entry and returns ApplyBatch's error.
func (h *harness) applyErr(data []byte) error {
	h.t.Helper()
	_, err := h.s.ApplyBatch([]LogEntry{{Index: h.index + 1, Data: data}})
	if err == nil {
		h.index++
	}
	return err
}

func pushEntry(t *testing.T, now int64, queue string) []byte {
	t.Helper()
	data, err := EncodeEntry(&Entry{Time: now, Cmds: []Command{&Push{Tenant: "default", Items: []PushItem{
		{Queue: queue, Partition: "p", TxID: uuid.NewString(), Generated: true, Payload: []byte(`"x"`)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestApplyStopsOnReadError: a read error inside Apply (injected with
// Pebble's errorfs on the table files) stops the store with an error that
// names the key and the fix; nothing of the batch is committed, later
// batches are refused, and after a reopen without the fault the same entry
// applies as if nothing had happened.
func TestApplyStopsOnReadError(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `"a"`, `"b"`)
	flushStore(t, h.s)
	var on atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if on.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsRead && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	h.openWithFS(fs)
	before := h.s.AppliedIndex()
	entry := pushEntry(t, h.now, "q")

	on.Store(true)
	err := h.applyErr(entry)
	var ae *ApplyError
	if !errors.As(err, &ae) {
		t.Fatalf("apply with a failing disk returned %v, want an *ApplyError", err)
	}
	if ae.Key == nil || !errors.Is(err, errorfs.ErrInjected) || !strings.Contains(err.Error(), "check the disk") {
		t.Fatalf("error %q: want the key, the injected error and the fix", err)
	}
	if got := h.s.AppliedIndex(); got != before {
		t.Fatalf("applied index moved from %d to %d on a failed batch", before, got)
	}
	on.Store(false)
	if err := h.applyErr(entry); !errors.As(err, &ae) {
		t.Fatalf("a halted store applied the next batch (err %v)", err)
	}
	if h.s.Halted() == nil {
		t.Fatal("Halted() is nil after a storage error")
	}

	h.openWithFS(vfs.Default)
	if err := h.applyErr(entry); err != nil {
		t.Fatalf("after the fault is gone the entry does not apply: %v", err)
	}
	if n := h.queueInfo("q").Total; n != 3 {
		t.Fatalf("queue holds %d messages after the re-apply, want 3", n)
	}
}

// TestApplyStopsOnCorruptRecord: a stored record that does not decode stops
// the store with its key, instead of being read as absent (which made a
// push create the queue again, over the damaged one).
func TestApplyStopsOnCorruptRecord(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `"a"`)
	h.s.waitCommitted()
	it, err := h.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tQueue}, UpperBound: []byte{tQueue + 1}})
	if err != nil {
		t.Fatal(err)
	}
	if !it.First() {
		t.Fatal("no queue record")
	}
	qk := append([]byte(nil), it.Key()...)
	it.Close()
	if err := h.s.db.Set(qk, []byte("{not json"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	h.reopen()
	err = h.applyErr(pushEntry(t, h.now, "q"))
	var ae *ApplyError
	if !errors.As(err, &ae) || !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("apply over a corrupt queue record returned %v, want an undecodable-record error", err)
	}
	if !bytes.Equal(ae.Key, qk) || !strings.Contains(err.Error(), "move its data directory away") {
		t.Fatalf("error %q: want key %x and the fix", err, qk)
	}
}

// TestApplyStopsOnUnknownCommand: an entry with a command kind this code
// does not know (written by a newer version) stops the store with "this node
// is older than the cluster: upgrade it"; it is never skipped.
func TestApplyStopsOnUnknownCommand(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `"a"`)
	h.s.waitCommitted()
	before := h.s.AppliedIndex()
	e := enc{}
	e.u8(entryVersion)
	e.i64(h.now)
	e.uv(1)
	e.u8(250) // no such kind
	e.bytes([]byte("{}"))
	err := h.applyErr(e.b)
	if !errors.Is(err, ErrUnknownCommand) || !strings.Contains(err.Error(), "this node is older than the cluster: upgrade it") {
		t.Fatalf("unknown command kind: err %v, want the upgrade error", err)
	}
	if h.s.AppliedIndex() != before {
		t.Fatalf("the unknown entry moved the applied index to %d", h.s.AppliedIndex())
	}
	if err := h.applyErr(pushEntry(t, h.now, "q")); !errors.Is(err, ErrUnknownCommand) {
		t.Fatalf("the entry after the unknown one was applied (err %v)", err)
	}
}
