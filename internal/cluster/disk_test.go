package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestFollowerFullDisk: a follower whose disk fills up (a 64 MiB tmpfs,
// filled to 1 MiB free) refuses writes sent through it with 507, refuses
// the leader's appends instead of failing them on the full disk, and the
// other two keep taking writes (3 MiB of them). Once space is freed it
// catches up by itself, to the leader's checksum. Before, its raft log
// hit the full disk, and after a failed segment rotation it refused every
// append ("segment is sealed") until restarted.
func TestFollowerFullDisk(t *testing.T) {
	disk := testkit.Tmpfs(t, 64<<20)
	const reserve = 16 << 20
	tc := startClusterWith(t, 3, func(i int, c *Config) {
		c.DiskReserve = reserve
		c.WALSegmentSize = 256 << 10
		if i == 2 {
			c.DataDir = filepath.Join(disk, "n3")
		}
	})
	f := tc.nodes[2]
	ctx := ctxT(t, 120*time.Second)
	// The node on the small disk must be a follower: hand leadership on
	// when the election made it the leader.
	if tc.leader() == f {
		if err := f.TransferLeadership(); err != nil {
			t.Fatalf("hand leadership away from the node on the small disk: %v", err)
		}
		if err := checkFor(15*time.Second, func() error {
			if l := tc.leader(); l == f {
				return errors.New("it still leads")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.Submit(ctx, kvPut("before", `"x"`, nil), 64); err != nil {
		t.Fatal(err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(disk, &st); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(disk, "filler")
	if err := os.WriteFile(filler, make([]byte, int64(st.Bavail)*st.Bsize-1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkFor(5*time.Second, func() error {
		if !f.ReadOnly() {
			return errors.New("not read-only")
		}
		return nil
	}); err != nil {
		t.Fatalf("the follower did not notice its full disk: %v (free %d)", err, f.DataDirFreeBytes())
	}
	_, err := f.Submit(ctx, kvPut("via-full", `"x"`, nil), 64)
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != "insufficient_storage" || !bytes.Contains([]byte(ce.Message), []byte(f.cfg.DataDir)) {
		t.Fatalf("a write through the full follower: %v, want 507 insufficient_storage naming %s", err, f.cfg.DataDir)
	}
	l := tc.leader()
	if l == f {
		t.Fatal("the follower with the full disk leads")
	}
	payload := []byte(fmt.Sprintf(`"%s"`, bytes.Repeat([]byte("p"), 10<<10)))
	for i := 0; i < 300; i++ {
		if _, err := l.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: fmt.Sprintf("t%d", i), Payload: payload}}}, len(payload)); err != nil {
			t.Fatalf("push %d with one follower's disk full: %v", i, err)
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// The leader is looked up afresh each round: an election under load
	// moves it on, and its applied index (and checksum) with it.
	if err := checkFor(90*time.Second, func() error {
		l := tc.leader()
		if l == nil {
			return errors.New("no leader")
		}
		li := l.AppliedIndex()
		want, err := l.Store().Checksum()
		if err != nil {
			return fmt.Errorf("leader's checksum: %w", err)
		}
		if l.AppliedIndex() != li {
			return fmt.Errorf("the leader moved on while its checksum was taken")
		}
		got, err := f.Store().Checksum()
		if err != nil || got != want || f.AppliedIndex() != li {
			return fmt.Errorf("follower at %d (checksum %x, %v), leader at %d (%x)", f.AppliedIndex(), got, err, li, want)
		}
		return nil
	}); err != nil {
		t.Fatalf("after space was freed the follower did not catch up: %v", err)
	}
	if _, err := f.Submit(ctx, kvPut("after", `"x"`, nil), 64); err != nil {
		t.Fatalf("a write through the follower after space was freed: %v", err)
	}
}
