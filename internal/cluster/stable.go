package cluster

import (
	"sync"

	"github.com/hashicorp/raft"
)

// closableStable is raft's stable store (the raft-wal log) with one rule
// for shutdown: once the node closes its stores, writes are dropped instead
// of failing. Raft answers heartbeats on the transport's goroutines, which
// its Shutdown does not wait for, and it panics when a heartbeat's term
// cannot be saved; after Close nothing of this node answers again, so a
// dropped term write loses nothing (the node learns the term anew when it
// restarts).
type closableStable struct {
	raft.StableStore
	mu     sync.RWMutex // writes hold it shared; close exclusively
	closed bool
}

// close makes later writes no-ops, after the writes under way finish.
func (s *closableStable) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

func (s *closableStable) Set(key, val []byte) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	return s.StableStore.Set(key, val)
}

func (s *closableStable) SetUint64(key []byte, val uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	return s.StableStore.SetUint64(key, val)
}
