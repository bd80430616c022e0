package state

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"testing"
)

// BenchmarkPushRandomIDs pushes 100 messages of about 120 bytes at a time
// into one partition, each with a random 32-hex-digit id, under a small
// memory budget: each push looks every id up among the partition's stored
// ones, and those lookups read filter and index blocks through the block
// cache. 100,000 messages are pushed before the timer starts. Sizes come
// from QUEEN_BENCH_CACHE_MIB and QUEEN_BENCH_MEMTABLE_MIB (default 4 and 16,
// the binary's shares at its default 128 MiB limit).
// Run: go test ./internal/state -run '^$' -bench BenchmarkPushRandomIDs -benchtime 2000x
func BenchmarkPushRandomIDs(b *testing.B) {
	mib := func(env string, def int64) int64 {
		if v, err := strconv.ParseInt(os.Getenv(env), 10, 64); err == nil && v > 0 {
			return v << 20
		}
		return def << 20
	}
	s, err := Open(b.TempDir(), Options{CacheBytes: mib("QUEEN_BENCH_CACHE_MIB", 4), MemTableBytes: mib("QUEEN_BENCH_MEMTABLE_MIB", 16)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	h := &harness{t: b, s: s, now: 1_700_000_000_000_000}
	payload := make([]byte, 120)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	id := make([]byte, 16)
	push := func() {
		c := &Push{Tenant: "default", Items: make([]PushItem, 100)}
		for j := range c.Items {
			if _, err := rand.Read(id); err != nil {
				b.Fatal(err)
			}
			c.Items[j] = PushItem{Queue: "q", Partition: "p", TxID: hex.EncodeToString(id), Payload: payload}
		}
		r := h.apply(c)[0].(*PushResult)
		if r.Err != nil || len(r.Items) != 100 || r.Items[99].Duplicate {
			b.Fatalf("push: %+v", r.Err)
		}
		h.now += 1000
	}
	for range 1000 {
		push()
	}
	s.waitCommitted()
	c0 := s.BlockCache()
	b.ResetTimer()
	cpu0 := cpuTime()
	for range b.N {
		push()
	}
	flushAndReport(b, s, cpu0, 100*b.N)
	c := s.BlockCache()
	b.ReportMetric(float64(c.Bytes)/(1<<20), "cache-MiB")
	b.ReportMetric(float64(c.Misses-c0.Misses)/float64(100*b.N), "misses/msg")
}
