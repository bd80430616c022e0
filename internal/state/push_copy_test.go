package state

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestPushCopiesPayloadOnce: a push's payloads go from the log entry
// straight into the batch; the buffer a push builds its keys and message
// heads in holds none of them. The messages read back whole, across a
// reopen (so from Pebble's tables and blob files, not the memtable).
func TestPushCopiesPayloadOnce(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	h := newHarness(t)
	const n, size = 64, 16 << 10
	payloads := make([]string, n)
	for i := range payloads {
		b := make([]byte, size+r.IntN(size))
		for j := range b {
			b[j] = 'a' + byte(r.IntN(26))
		}
		payloads[i] = string(b)
	}
	h.push("q", "p", payloads...)
	// The keys and heads of 64 messages take a few KiB; the payloads
	// alone are over 1 MiB.
	if c := cap(h.s.pushBuf); c >= n*size {
		t.Fatalf("the push buffer grew to %d bytes for %d payloads of at least %d: payloads were copied into it", c, n, size)
	}
	h.reopen()
	got := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: n, Partitions: 1, LeaseSeconds: 10})
	if len(got.Messages) != n {
		t.Fatalf("popped %d messages, want %d", len(got.Messages), n)
	}
	for i, m := range got.Messages {
		if m.Offset != uint64(i) || !bytes.Equal(m.Payload, []byte(payloads[i])) {
			t.Fatalf("message %d: offset %d, payload of %d bytes (%q…), want offset %d and the %d bytes pushed",
				i, m.Offset, len(m.Payload), fmt.Sprint(m.Payload[:min(8, len(m.Payload))]), i, len(payloads[i]))
		}
	}
}
