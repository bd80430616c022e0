package budget

import "testing"

// Every limit is shared out whole: the blocks, two memtables and the Go
// heap's limit add up to it (with Pebble off the Go heap), and the
// memtables and the retry results stay within their bounds.
func TestForSharesTheWholeLimit(t *testing.T) {
	for _, limit := range []int64{Min, Default, 200 << 20, 512 << 20, 1 << 30, 3 << 30, 64 << 30} {
		b := For(limit)
		if b.Limit != limit {
			t.Errorf("%d: limit %d", limit, b.Limit)
		}
		if b.MemTableBytes < 4<<20 || b.MemTableBytes > 64<<20 || b.DedupBytes < 4<<20 || b.DedupBytes > 64<<20 {
			t.Errorf("%d: memtable %d, retry results %d; want each within 4-64 MiB", limit, b.MemTableBytes, b.DedupBytes)
		}
		if b.CacheBytes <= 0 || b.GoLimit <= 0 {
			t.Errorf("%d: blocks %d, Go limit %d; want both positive", limit, b.CacheBytes, b.GoLimit)
		}
		want := limit - b.CacheBytes - 2*b.MemTableBytes
		if !PebbleOffHeap {
			want = limit
		}
		if b.GoLimit != want {
			t.Errorf("%d: Go limit %d, want %d", limit, b.GoLimit, want)
		}
	}
	if d := For(Default); d.CacheBytes != 4<<20 || d.MemTableBytes != 16<<20 || d.DedupBytes != 4<<20 {
		t.Errorf("the default budget: %+v; want 4 MiB of blocks, 16 MiB memtables, 4 MiB of retry results", d)
	}
}
