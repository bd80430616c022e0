package main

import (
	"math"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/queen-mq/queen/internal/budget"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/testkit"
)

func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"536870912", 512 << 20}, {"512MiB", 512 << 20}, {"512mib", 512 << 20}, {"512M", 512 << 20},
		{"2GiB", 2 << 30}, {"1.5GiB", 3 << 29}, {"800MB", 800e6}, {" 1 GiB ", 1 << 30}, {"4096KiB", 4 << 20},
	} {
		got, err := parseBytes(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "lots", "12XB", "-1GiB", "GiB", "1e30GiB"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d; want an error", in, got)
		}
	}
}

// The limit is shared out and applied: Pebble opens with the cache and
// memtable sizes, and the Go runtime's soft limit is set.
func TestMemoryLimitApplied(t *testing.T) {
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64) })
	t.Setenv("GOMEMLIMIT", "")
	if _, err := memoryFromSetting("100MiB"); err == nil || !strings.Contains(err.Error(), "at least 128MiB") {
		t.Errorf("100MiB: %v; want a refusal naming the minimum", err)
	}
	for _, c := range []struct {
		setting                         string
		cache, memtable, dedup, goLimit int64
	}{
		{"512MiB", 16 << 20, 64 << 20, 16 << 20, 512<<20 - 16<<20 - 2*64<<20},
		{"4GiB", 128 << 20, 64 << 20, 64 << 20, 4<<30 - 128<<20 - 2*64<<20},
		{"128MiB", 4 << 20, 16 << 20, 4 << 20, 128<<20 - 4<<20 - 2*16<<20},
		// Unset is the default budget.
		{"", 4 << 20, 16 << 20, 4 << 20, 128<<20 - 4<<20 - 2*16<<20},
	} {
		b, err := memoryFromSetting(c.setting)
		if err != nil {
			t.Fatal(err)
		}
		if !budget.PebbleOffHeap {
			c.goLimit = b.Limit
		}
		if b.CacheBytes != c.cache || b.MemTableBytes != c.memtable || b.DedupBytes != c.dedup || b.GoLimit != c.goLimit {
			t.Errorf("%q: %+v; want cache %d, memtable %d, retry results %d, Go %d", c.setting, b, c.cache, c.memtable, c.dedup, c.goLimit)
		}
		if got := applyBudget(b); got != c.goLimit || debug.SetMemoryLimit(-1) != c.goLimit {
			t.Errorf("%q: Go memory limit %d; want %d", c.setting, got, c.goLimit)
		}
	}
	// off: every size at its own default, no heap limit.
	debug.SetMemoryLimit(math.MaxInt64)
	if b, err := memoryFromSetting("off"); err != nil || b != (budget.Budget{}) {
		t.Errorf("off: %+v, %v; want a zero budget", b, err)
	} else if got := applyBudget(b); got != math.MaxInt64 {
		t.Errorf("off: Go memory limit %d; want none", got)
	}
	b, _ := memoryFromSetting("512MiB")
	n, err := cluster.Open(cluster.Config{DataDir: filepath.Join(t.TempDir(), "n"), RaftAddr: testkit.FreeAddr(t),
		CacheBytes: b.CacheBytes, MemTableBytes: b.MemTableBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if cache, memtable := n.Store().MemoryBudget(); cache != b.CacheBytes || memtable != b.MemTableBytes {
		t.Errorf("store opened with cache %d, memtable %d; want %d, %d", cache, memtable, b.CacheBytes, b.MemTableBytes)
	}
	// GOMEMLIMIT in the environment wins.
	debug.SetMemoryLimit(math.MaxInt64)
	t.Setenv("GOMEMLIMIT", "1GiB")
	if got := applyBudget(b); got != math.MaxInt64 {
		t.Errorf("with GOMEMLIMIT set, apply changed the limit to %d", got)
	}
}
