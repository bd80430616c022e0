package cluster

import (
	"testing"

	"github.com/hashicorp/raft"
)

// TestStableWritesAfterCloseAreDropped: once closed, the wrapper does not
// pass a write to the closed store (raft would panic on its error).
func TestStableWritesAfterCloseAreDropped(t *testing.T) {
	inner := raft.NewInmemStore()
	s := &closableStable{StableStore: inner}
	if err := s.SetUint64([]byte("CurrentTerm"), 2); err != nil {
		t.Fatal(err)
	}
	s.close()
	if err := s.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatalf("a write after close: %v, want it dropped", err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("x")); err != nil {
		t.Fatalf("a write after close: %v, want it dropped", err)
	}
	if v, err := inner.GetUint64([]byte("CurrentTerm")); err != nil || v != 2 {
		t.Fatalf("the store holds term %d (%v), want 2: the write after close reached it", v, err)
	}
}
