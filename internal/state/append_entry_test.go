package state

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"reflect"
	"testing"
	"time"
)

// TestAppendEntryMatchesEncodeEntry checks that AppendEntry writes the same
// bytes as EncodeEntry behind whatever dst holds, leaves dst's bytes alone,
// grows dst once (to exactly the entry's size), and that the appended entry
// decodes to what was encoded.
func TestAppendEntryMatchesEncodeEntry(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	for i, cmds := range randomCommands(seed, 300) {
		en := &Entry{Time: rng.Int63(), Cmds: cmds}
		want, err := EncodeEntry(en)
		if err != nil {
			t.Fatalf("seed %d entry %d: EncodeEntry: %v", seed, i, err)
		}
		prefix := make([]byte, rng.Intn(80))
		rng.Read(prefix)
		dst := append(make([]byte, 0, len(prefix)), prefix...)
		got, err := AppendEntry(dst, en)
		if err != nil {
			t.Fatalf("seed %d entry %d: AppendEntry: %v", seed, i, err)
		}
		if !bytes.Equal(got[:len(prefix)], prefix) {
			t.Fatalf("seed %d entry %d: the prefix changed", seed, i)
		}
		if !bytes.Equal(got[len(prefix):], want) {
			t.Fatalf("seed %d entry %d: AppendEntry wrote\n%x\nEncodeEntry\n%x", seed, i, got[len(prefix):], want)
		}
		if len(got) != len(prefix)+len(want) {
			t.Fatalf("seed %d entry %d: len %d, want %d", seed, i, len(got), len(prefix)+len(want))
		}
		a, err := DecodeEntry(got[len(prefix):])
		if err != nil {
			t.Fatalf("seed %d entry %d: decode the appended entry: %v", seed, i, err)
		}
		b, err := DecodeEntry(want)
		if err != nil {
			t.Fatalf("seed %d entry %d: decode EncodeEntry's: %v", seed, i, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d entry %d: decoded entries differ:\n%#v\n%#v", seed, i, a, b)
		}
	}
}

// TestAppendEntryInPlace checks that an entry appended to a dst with room
// for it is written into dst's array (no new allocation, no copy).
func TestAppendEntryInPlace(t *testing.T) {
	en := &Entry{Time: 5, Cmds: []Command{&Push{Tenant: "default", Items: []PushItem{{Queue: "q", Partition: "p", TxID: "t", Payload: bytes.Repeat([]byte("x"), 4096)}}}}}
	want, err := EncodeEntry(en)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 3, 3+len(want))
	got, err := AppendEntry(dst, en)
	if err != nil {
		t.Fatal(err)
	}
	if &got[0] != &dst[0] {
		t.Fatal("AppendEntry reallocated a dst that had room for the entry")
	}
	if !bytes.Equal(got[3:], want) {
		t.Fatal("AppendEntry wrote different bytes from EncodeEntry")
	}
	if n := testing.AllocsPerRun(20, func() {
		if _, err := AppendEntry(dst, en); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("AppendEntry into a dst with room allocated %.0f times per call, want 0", n)
	}
}

// TestAppendEntryErrorKeepsDst checks that a command that does not encode
// fails the append and hands dst back as it was.
func TestAppendEntryErrorKeepsDst(t *testing.T) {
	dst := []byte{0xC1, 0}
	got, err := AppendEntry(dst, &Entry{Cmds: []Command{&Tick{}, &Configure{Tenant: "default", Queue: "q", Options: map[string]json.RawMessage{"x": json.RawMessage("{")}}}})
	if err == nil {
		t.Fatal("AppendEntry encoded options that are not JSON")
	}
	if !bytes.Equal(got, dst) {
		t.Fatalf("AppendEntry returned %x on error, want dst %x", got, dst)
	}
}
