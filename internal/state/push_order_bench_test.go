package state

import (
	"encoding/binary"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// benchKeyOrder commits batches of 1,000 rows of four key families (a
// bundle of new partitions' shape) to a Pebble memtable, the rows' keys
// either interleaved row by row (as the apply writes them) or grouped by
// family in key order, and reports the process CPU per batch, flushes
// included.
func benchKeyOrder(b *testing.B, grouped bool) {
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, MemTableSize: 256 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	val := make([]byte, 60)
	k := make([]byte, 17)
	id := uint64(1)
	b.ResetTimer()
	c0 := cpuTime()
	defer func() { b.ReportMetric(float64((cpuTime()-c0).Nanoseconds())/float64(b.N), "cpu-ns/batch") }()
	for i := 0; i < b.N; i++ {
		bt := db.NewBatch()
		if grouped {
			for f := byte(1); f <= 4; f++ {
				for j := uint64(0); j < 1000; j++ {
					k[0] = f
					binary.BigEndian.PutUint64(k[1:], id+j)
					_ = bt.Set(k, val, nil)
				}
			}
		} else {
			for j := uint64(0); j < 1000; j++ {
				for f := byte(1); f <= 4; f++ {
					k[0] = f
					binary.BigEndian.PutUint64(k[1:], id+j)
					_ = bt.Set(k, val, nil)
				}
			}
		}
		id += 1000
		if err := bt.Commit(pebble.NoSync); err != nil {
			b.Fatal(err)
		}
		bt.Close()
		if i%100 == 99 {
			if err := db.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// Run: go test ./internal/state -run '^$' -bench BenchmarkBatchKeyOrder -benchtime 200x
func BenchmarkBatchKeyOrder(b *testing.B) {
	b.Run("interleaved", func(b *testing.B) { benchKeyOrder(b, false) })
	b.Run("grouped", func(b *testing.B) { benchKeyOrder(b, true) })
}
