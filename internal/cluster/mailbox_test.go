package cluster

import "testing"

// TestMailboxRecycle: a slice given back is filled by the next puts (no
// new one grown), holds nothing of what it held, and the items still come
// out in order.
func TestMailboxRecycle(t *testing.T) {
	m := newMailbox[*int]()
	a, b, c := new(int), new(int), new(int)
	m.put(a)
	m.put(b)
	first := m.take()
	if len(first) != 2 || first[0] != a || first[1] != b {
		t.Fatalf("take: %v", first)
	}
	m.recycle(first)
	if first[:2][0] != nil || first[:2][1] != nil {
		t.Fatal("a recycled slice still holds its items")
	}
	allocs := testing.AllocsPerRun(1, func() {
		m.put(c)
		m.put(a)
		got := m.take()
		if len(got) != 2 || got[0] != c || got[1] != a {
			t.Fatalf("take after recycle: %v", got)
		}
		m.recycle(got)
	})
	if allocs != 0 {
		t.Fatalf("puts into a recycled slice allocated %.0f times; want 0", allocs)
	}
	// A slice past maxSpare is not kept (the spare is taken first, and
	// not given back).
	m.put(b)
	m.take()
	big := make([]*int, 0, maxSpare+1)
	m.recycle(big)
	m.put(a)
	if got := m.take(); cap(got) > maxSpare {
		t.Fatalf("a slice of capacity %d was kept", cap(got))
	}
}
