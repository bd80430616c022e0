package state

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestPayloadsInBlobFiles: payloads of blobMinSize bytes or more are moved
// into blob files when the memtable is flushed, smaller ones stay inline,
// and every payload reads back byte for byte: from the memtable, from the
// flushed files, after a compaction and after the store is reopened.
func TestPayloadsInBlobFiles(t *testing.T) {
	h := newHarness(t)
	rng := rand.New(rand.NewSource(1))
	// Sizes around the threshold, JSON-quoted hex (incompressible).
	sizes := []int{2, blobMinSize - 3, blobMinSize - 2, blobMinSize, 1024, 64 << 10}
	var want [][]byte
	for round := 0; round < 20; round++ {
		c := &Push{Tenant: "default"}
		for _, n := range sizes {
			raw := make([]byte, (n-2)/2)
			rng.Read(raw)
			p := []byte(`"` + hex.EncodeToString(raw) + `"`)
			want = append(want, p)
			c.Items = append(c.Items, PushItem{Queue: "q", Partition: "p", TxID: fmt.Sprintf("t%d-%d", round, n), Payload: p})
		}
		h.apply(c)
	}
	readAll := func(when string) {
		t.Helper()
		r := h.pop(Pop{Queue: "q", Group: fmt.Sprintf("g-%s", when), SubMode: "all", Batch: len(want), Partitions: 1, LeaseSeconds: 30, AutoAck: true})
		if len(r.Messages) != len(want) {
			t.Fatalf("%s: popped %d messages, want %d", when, len(r.Messages), len(want))
		}
		for i, m := range r.Messages {
			if !bytes.Equal(m.Payload, want[i]) {
				t.Fatalf("%s: message %d (%d bytes) read back as %d different bytes", when, i, len(want[i]), len(m.Payload))
			}
		}
	}
	readAll("memtable")
	flushStore(t, h.s)
	m := h.s.db.Metrics()
	if m.BlobFiles.LiveCount == 0 {
		t.Fatal("no blob file after a flush of payloads over the threshold")
	}
	// Only the payloads at or over the threshold left the tables.
	var large uint64
	for _, p := range want {
		if len(p) >= blobMinSize {
			large += uint64(len(p))
		}
	}
	if got := m.BlobFiles.ValueSize; got < large || got > large+large/10 {
		t.Fatalf("blob files hold %d bytes of values; the payloads of %d bytes or more total %d", got, blobMinSize, large)
	}
	readAll("flushed")
	if err := h.s.db.Compact(t.Context(), []byte{0}, []byte{0xff}, false); err != nil {
		t.Fatal(err)
	}
	readAll("compacted")
	h.reopen()
	readAll("reopened")
}

// TestUpgradeFromTablesOnly: a store written before blob files existed (an
// older Pebble format, every payload inline) opens, keeps every payload,
// and moves new large payloads into blob files.
func TestUpgradeFromTablesOnly(t *testing.T) {
	h := func() *harness {
		storeFormat = pebble.FormatMinSupported
		defer func() { storeFormat = pebble.FormatValueSeparation }()
		return newHarness(t)
	}()
	big := []byte(`"` + strings.Repeat("a", 1000) + `"`)
	h.push("q", "p", string(big), `1`)
	flushStore(t, h.s)
	if h.s.db.FormatMajorVersion() >= pebble.FormatValueSeparation || h.s.db.Metrics().BlobFiles.LiveCount != 0 {
		t.Fatalf("the old-format store has format %s and %d blob files", h.s.db.FormatMajorVersion(), h.s.db.Metrics().BlobFiles.LiveCount)
	}
	h.reopen()
	if got := h.s.db.FormatMajorVersion(); got != pebble.FormatValueSeparation {
		t.Fatalf("reopened store has format %s, want %s", got, pebble.FormatValueSeparation)
	}
	h.push("q", "p", string(big))
	flushStore(t, h.s)
	if h.s.db.Metrics().BlobFiles.LiveCount == 0 {
		t.Fatal("no blob file for a large payload pushed after the upgrade")
	}
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 10, Partitions: 1, LeaseSeconds: 30})
	want := []string{string(big), `1`, string(big)}
	if len(r.Messages) != len(want) {
		t.Fatalf("popped %d messages after the upgrade, want %d", len(r.Messages), len(want))
	}
	for i, m := range r.Messages {
		if string(m.Payload) != want[i] {
			t.Fatalf("message %d changed across the upgrade: %d bytes, want %d", i, len(m.Payload), len(want[i]))
		}
	}
}

// flushStore flushes the memtable once the last applied batch is in it
// (ApplyBatch hands the insert to another goroutine).
func flushStore(t *testing.T, s *Store) {
	t.Helper()
	s.waitCommitted()
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
}
