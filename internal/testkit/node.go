package testkit

import (
	"sync"
	"syscall"
	"testing"
	"time"
)

// Node is one member of a process-level test cluster whose settings the
// test holds itself: its Queen is made at the first start and kept, with
// its ports, data directory and log, across kills and restarts.
type Node struct {
	mu sync.Mutex
	q  *Queen
}

// Queen is the node's process handle (nil before its first start).
func (n *Node) Queen() *Queen {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.q
}

// Alive reports whether the node's process runs.
func (n *Node) Alive() bool {
	q := n.Queen()
	return q != nil && q.Alive()
}

// Start starts the node with env (its settings as they are now); build
// builds its Queen at the first start.
func (n *Node) Start(t testing.TB, build func() *Queen, env []string) {
	t.Helper()
	n.mu.Lock()
	if n.q == nil {
		n.q = build()
	}
	q := n.q
	n.mu.Unlock()
	q.Env = env
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
}

// Signal sends sig and waits up to within for the process to exit; a
// node never started is left alone. A failure is reported, not fatal, so
// that cleanups go on.
func (n *Node) Signal(t testing.TB, name string, sig syscall.Signal, within time.Duration) {
	q := n.Queen()
	if q == nil {
		return
	}
	if err := q.Signal(sig, within); err != nil {
		t.Errorf("%s: %v", name, err)
	}
}
