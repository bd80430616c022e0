package cluster

import (
	"bytes"
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// wrapEntry puts the envelope of ids in front of an already encoded state
// entry, copying it: what proposals did before encodeProposal, kept for
// tests that build raft entries by hand and as the reference encoding.
func wrapEntry(ids []reqID, entry []byte) []byte {
	out := appendEnvelope(make([]byte, 0, envelopeSize(len(ids))+len(entry)), ids)
	return append(out, entry...)
}

// randomEntry builds an entry of 1-5 random commands: pushes (payloads up
// to 64 KiB), pops, acks, transactions and ticks.
func randomEntry(rng *rand.Rand) *state.Entry {
	str := func(n int) string {
		b := make([]byte, rng.Intn(n+1))
		for i := range b {
			b[i] = byte('a' + rng.Intn(26))
		}
		return string(b)
	}
	payload := func() []byte {
		b := make([]byte, rng.Intn(1<<[]int{6, 10, 16}[rng.Intn(3)]))
		rng.Read(b)
		return b
	}
	items := func() []state.PushItem {
		its := make([]state.PushItem, 1+rng.Intn(8))
		for i := range its {
			its[i] = state.PushItem{Queue: str(12), Partition: str(8), TxID: str(36), TraceID: str(4),
				Generated: rng.Intn(2) == 0, Sealed: rng.Intn(4) == 0, Payload: payload()}
		}
		return its
	}
	en := &state.Entry{Time: rng.Int63()}
	for range 1 + rng.Intn(5) {
		switch rng.Intn(5) {
		case 0, 1:
			en.Cmds = append(en.Cmds, &state.Push{Tenant: str(8), Retry: rng.Intn(3) == 0, Items: items()})
		case 2:
			en.Cmds = append(en.Cmds, &state.Pop{Tenant: str(8), Queue: str(12), Group: str(6), Batch: 1 + rng.Intn(100),
				Partitions: rng.Intn(4), LeaseID: str(36), AutoAck: rng.Intn(2) == 0})
		case 3:
			off := uint64(rng.Intn(1000))
			en.Cmds = append(en.Cmds, &state.Ack{Tenant: str(8), Items: []state.AckItem{{PartitionID: uint64(1 + rng.Intn(50)),
				Offset: &off, Status: state.AckCompleted, Group: str(6), LeaseID: str(36)}}})
		default:
			if rng.Intn(2) == 0 {
				en.Cmds = append(en.Cmds, &state.Tick{})
			} else {
				en.Cmds = append(en.Cmds, &state.Txn{Tenant: str(8), RequiredLeases: []string{str(36)},
					Ops: []state.TxnOp{{Type: state.OpPush, Items: items()}}})
			}
		}
	}
	return en
}

// TestEncodeProposalMatchesWrap checks that a proposal encoded in place
// behind its envelope is byte for byte what wrapping an encoded entry gave
// (the log format is unchanged), that it unwraps to the same request ids
// and decodes to the same entry.
func TestEncodeProposalMatchesWrap(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	for i := range 300 {
		en := randomEntry(rng)
		// 0 ids (entries without requests), 1, and more than 127 (a
		// two-byte count).
		ids := make([]reqID, []int{0, 1, 1 + rng.Intn(200)}[rng.Intn(3)])
		for j := range ids {
			rng.Read(ids[j][:])
		}
		data, err := state.EncodeEntry(en)
		if err != nil {
			t.Fatalf("seed %d entry %d: EncodeEntry: %v", seed, i, err)
		}
		want := wrapEntry(ids, data)
		got, err := encodeProposal(nil, ids, en)
		if err != nil {
			t.Fatalf("seed %d entry %d: encodeProposal: %v", seed, i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("seed %d entry %d: encodeProposal gave %d bytes, wrapEntry %d; first difference at %d",
				seed, i, len(got), len(want), firstDiff(got, want))
		}
		if dataKey(got) != dataKey(want) {
			t.Fatalf("seed %d entry %d: the stage key differs", seed, i)
		}
		gotIDs, rest := unwrapEntry(got)
		if len(gotIDs) != len(ids) || (len(ids) > 0 && !reflect.DeepEqual(gotIDs, ids)) {
			t.Fatalf("seed %d entry %d: unwrapped %d ids, want %d", seed, i, len(gotIDs), len(ids))
		}
		dec, err := state.DecodeEntry(rest)
		if err != nil {
			t.Fatalf("seed %d entry %d: decode: %v", seed, i, err)
		}
		ref, err := state.DecodeEntry(data)
		if err != nil {
			t.Fatalf("seed %d entry %d: decode the reference: %v", seed, i, err)
		}
		if !reflect.DeepEqual(dec, ref) {
			t.Fatalf("seed %d entry %d: decoded entries differ", seed, i)
		}
	}
}

// TestEncodeProposalOneCopy checks that encodeProposal allocates the entry
// once: its bytes allocated stay within the entry's size and a small
// header, where wrapping an encoded entry allocates the entry twice.
func TestEncodeProposalOneCopy(t *testing.T) {
	payload := bytes.Repeat([]byte("p"), 1<<16)
	en := &state.Entry{Time: 1}
	for i := range 4 {
		en.Cmds = append(en.Cmds, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: fmt.Sprint(i), TxID: fmt.Sprint(i), Payload: payload}}})
	}
	ids := []reqID{newReqID(), newReqID(), newReqID(), newReqID()}
	size := len(wrapEntry(ids, mustEncode(t, en)))
	// Other tests' nodes may still be allocating as they stop, and the
	// counts are process-wide: the least of five trials is this code's.
	const runs = 20
	minAllocs, minBytes := uint64(math.MaxUint64), uint64(math.MaxUint64)
	for range 5 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			if _, err := encodeProposal(nil, ids, en); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		minAllocs = min(minAllocs, (after.Mallocs-before.Mallocs)/runs)
		minBytes = min(minBytes, (after.TotalAlloc-before.TotalAlloc)/runs)
	}
	if minAllocs > 3 {
		t.Fatalf("encodeProposal allocated %d times, want at most 3 (the envelope, the entry, the list of bodies)", minAllocs)
	}
	if minBytes > uint64(size+size/8) {
		t.Fatalf("encodeProposal allocated %d bytes for a %d-byte entry, want about one entry", minBytes, size)
	}
}

func mustEncode(t *testing.T, en *state.Entry) []byte {
	t.Helper()
	b, err := state.EncodeEntry(en)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestEncodeProposalReusesBuffer checks that a buffer with the room is
// encoded into from its start, and allocates no second entry.
func TestEncodeProposalReusesBuffer(t *testing.T) {
	payload := bytes.Repeat([]byte("p"), 1<<16)
	en := &state.Entry{Time: 1}
	for i := range 4 {
		en.Cmds = append(en.Cmds, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: fmt.Sprint(i), TxID: fmt.Sprint(i), Payload: payload}}})
	}
	ids := []reqID{newReqID(), newReqID(), newReqID(), newReqID()}
	want := wrapEntry(ids, mustEncode(t, en))
	buf := make([]byte, 7, len(want))
	got, err := encodeProposal(buf, ids, en)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encoded into a buffer: %d bytes, differ from the %d of a new one", len(got), len(want))
	}
	if &got[0] != &buf[:1][0] {
		t.Fatal("a buffer with the room was not reused")
	}
	// The counts are process-wide (other tests' nodes may still be
	// stopping): the least of five trials is this code's.
	allocs := math.Inf(1)
	for range 5 {
		allocs = min(allocs, testing.AllocsPerRun(20, func() {
			if _, err := encodeProposal(got, ids, en); err != nil {
				t.Fatal(err)
			}
		}))
	}
	// The list of bodies of an entry of several commands.
	if allocs > 1 {
		t.Fatalf("encodeProposal into a buffer with the room allocated %.0f times, want at most 1", allocs)
	}
}
