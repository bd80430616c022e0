package state

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestBlockCacheHoldsBlocksBesideMemTables writes enough for the memtables
// to reach their full size, so that Pebble charges the two it holds against
// the cache, and reads the flushed keys back: the cache must keep blocks
// and serve the second read. With a cache only as large as the blocks'
// share, the memtables' reservations took all of it and no block stayed.
func TestBlockCacheHoldsBlocksBesideMemTables(t *testing.T) {
	const mib = 1 << 20
	s, err := Open(t.TempDir(), Options{CacheBytes: 4 * mib, MemTableBytes: 4 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db := s.DB()
	key := func(i int) []byte { return fmt.Appendf(nil, "\xf0test-%08d", i) }
	val := make([]byte, 200)
	const n = 120_000 // 24 MB: memtables grow to 4 MiB and several flush
	for i := range n {
		val[0] = byte(i)
		if err := db.Set(key(i), val, pebble.NoSync); err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	read := func() {
		for i := n - 10_000; i < n; i++ {
			v, closer, err := db.Get(key(i))
			if err != nil {
				t.Fatalf("get %d: %v", i, err)
			}
			if len(v) != len(val) || v[0] != byte(i) {
				t.Fatalf("get %d: %d bytes, first %d", i, len(v), v[0])
			}
			closer.Close()
		}
	}
	read()
	before := s.BlockCache()
	read()
	after := s.BlockCache()
	t.Logf("block cache after the first read %+v, after the second %+v", before, after)
	if after.Bytes == 0 || after.Blocks == 0 {
		t.Fatalf("the block cache holds no blocks (%+v): the memtables' reservations took its capacity", after)
	}
	if hits := after.Hits - before.Hits; hits < 10_000 {
		t.Fatalf("the second read of 10,000 keys hit the cache %d times, want at least once per key", hits)
	}
}

// TestTablesHoldLargeBlocks checks that flushed tables are cut into blocks of
// about blockSize (uncompressed), not Pebble's default 4 KiB: a consumer
// reading a backlog loads one block per blockSize of messages.
func TestTablesHoldLargeBlocks(t *testing.T) {
	h := newHarness(t)
	payload := `{"id":"0123456789","note":"` + fmt.Sprintf("%0150d", 7) + `"}`
	for i := range 100 {
		c := &Push{Tenant: "default"}
		for j := range 200 {
			c.Items = append(c.Items, PushItem{Queue: "q", Partition: fmt.Sprint(j % 4), TxID: fmt.Sprintf("tx-%d-%d", i, j), Payload: []byte(payload)})
		}
		if r := h.apply(c)[0].(*PushResult); r.Err != nil {
			t.Fatalf("push %d: %v", i, r.Err)
		}
	}
	if err := h.s.DB().Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	levels, err := h.s.DB().SSTables(pebble.WithProperties())
	if err != nil {
		t.Fatalf("tables: %v", err)
	}
	var raw, blocks uint64
	for _, level := range levels {
		for _, tb := range level {
			raw += tb.Properties.RawKeySize + tb.Properties.RawValueSize
			blocks += tb.Properties.NumDataBlocks
		}
	}
	if blocks == 0 {
		t.Fatal("no data blocks after a flush of 20,000 messages")
	}
	avg := raw / blocks
	t.Logf("%d data blocks, %d raw bytes, %d per block", blocks, raw, avg)
	if avg < 16<<10 {
		t.Fatalf("data blocks hold %d raw bytes on average, want at least 16 KiB (blockSize %d)", avg, blockSize)
	}
}
