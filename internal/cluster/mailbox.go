package cluster

import "sync"

// mailbox is an unbounded FIFO queue between goroutines: put never blocks,
// so the ready loop never waits for the storage threads (nor they for it).
type mailbox[T any] struct {
	mu    sync.Mutex
	items []T
	// spare is a taken slice given back (recycle), which the next put
	// fills instead of growing a new one.
	spare  []T
	notify chan struct{} // one token while items is not empty
}

// maxSpare bounds the capacity of a slice a mailbox keeps for reuse.
const maxSpare = 1024

func newMailbox[T any]() *mailbox[T] { return &mailbox[T]{notify: make(chan struct{}, 1)} }

func (m *mailbox[T]) put(v T) {
	m.mu.Lock()
	if m.items == nil && m.spare != nil {
		m.items, m.spare = m.spare, nil
	}
	m.items = append(m.items, v)
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// take returns everything queued (nil when empty).
func (m *mailbox[T]) take() []T {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.items
	m.items = nil
	return out
}

// recycle gives back a slice take returned, once its reader is done with
// it (nothing may keep it): the next puts fill it again.
func (m *mailbox[T]) recycle(used []T) {
	if cap(used) == 0 || cap(used) > maxSpare {
		return
	}
	clear(used)
	m.mu.Lock()
	if m.spare == nil {
		m.spare = used[:0]
	}
	m.mu.Unlock()
}

// takeNow is take for a reader that does not wait on ready first: it
// clears the wake-up token, so that items it takes do not wake it again.
func (m *mailbox[T]) takeNow() []T {
	select {
	case <-m.notify:
	default:
	}
	return m.take()
}

// ready is signalled when items may be waiting.
func (m *mailbox[T]) ready() <-chan struct{} { return m.notify }
