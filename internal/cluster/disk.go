package cluster

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/queen-mq/queen/internal/stagetime"
	"github.com/queen-mq/queen/internal/state"
)

// DefaultDiskReserve is the free space below which a node refuses writes.
const DefaultDiskReserve = 256 << 20

// diskGuard watches the free space of the data directory. Below the
// reserve the node refuses writes (insufficient_storage) and keeps
// answering reads; above it again, writes resume by themselves. Refusing
// before the disk is full keeps the raft log and Pebble from ever failing
// a write on a full disk (raft-wal cannot append again after a failed
// segment rotation until it is reopened), and leaves Pebble the room its
// flushes and compactions need, so that nothing stalls and nothing
// acknowledged is lost.
type diskGuard struct {
	dir     string
	reserve uint64 // 0: the guard is off
	log     *slog.Logger
	free    atomic.Uint64
	full    atomic.Bool
	failed  atomic.Bool // statfs failed (logged once)
}

const diskCheckEvery = 250 * time.Millisecond

func newDiskGuard(dir string, reserve int64, log *slog.Logger) *diskGuard {
	g := &diskGuard{dir: dir, log: log}
	switch {
	case reserve == 0:
		g.reserve = DefaultDiskReserve
	case reserve > 0:
		g.reserve = uint64(reserve)
	}
	g.check()
	return g
}

// check reads the free space once and updates the state.
func (g *diskGuard) check() {
	var st syscall.Statfs_t
	if err := syscall.Statfs(g.dir, &st); err != nil {
		if !g.failed.Swap(true) {
			g.log.Warn("cannot read the free space of the data directory; writes are not guarded against a full disk", "dir", g.dir, "err", err)
		}
		return
	}
	free := st.Bavail * uint64(st.Bsize)
	g.free.Store(free)
	full := g.reserve > 0 && free < g.reserve
	if was := g.full.Swap(full); was != full {
		if full {
			g.log.Error("the data directory's disk is nearly full: refusing writes until space is freed (reads keep working); free space on this disk, or raise its size",
				"dir", g.dir, "free_bytes", free, "reserve_bytes", g.reserve)
		} else {
			g.log.Warn("the data directory's disk has space again: accepting writes", "dir", g.dir, "free_bytes", free)
		}
	}
}

// refuse returns the error for a write while the disk is full, or nil.
func (g *diskGuard) refuse() error {
	if !g.full.Load() {
		return nil
	}
	return &Error{Code: "insufficient_storage", Message: fmt.Sprintf(
		"the disk of this node's data directory %s is nearly full (%d bytes free, below the reserve of %d set by QUEEN_DISK_RESERVE_BYTES): writes are refused until space is freed there; reads keep working",
		g.dir, g.free.Load(), g.reserve)}
}

// allowedWhenFull reports whether a command may be proposed on a full
// disk: deleting a queue is how an operator frees space.
func allowedWhenFull(c state.Command) bool {
	_, ok := c.(*state.DeleteQueue)
	return ok
}

func (n *Node) watchDisk() {
	defer n.wg.Done()
	t := time.NewTicker(diskCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-n.closing:
			return
		case <-t.C:
			n.disk.check()
		}
	}
}

// DataDirFreeBytes is the free space of the data directory's disk, as of
// the last check.
func (n *Node) DataDirFreeBytes() uint64 { return n.disk.free.Load() }

// ReadOnly reports whether the node refuses writes for lack of disk space.
func (n *Node) ReadOnly() bool { return n.disk.full.Load() }

// guardedLog is the raft log: raft-wal, whose appends a follower refuses
// while its disk is below the reserve, before anything is written. The
// append thread then holds the entries, and the acknowledgement raft waits
// for, until space is freed (loop.go); the leader commits with the other
// followers meanwhile, and this one catches up once it can write. Without
// it the append would fail on the full disk itself, and raft-wal, after a
// failed segment rotation, refuses every later append until it is
// reopened. A leader's own appends are not refused: its disk guard refuses
// the commands before they reach the log.
type guardedLog struct {
	*syncedLog // raft-wal, with the fsync policy (fsyncpolicy.go)
	disk       *diskGuard
	leader     func() bool
	node       string
}

func (g *guardedLog) StoreLogs(logs []*walRecord) error { return g.storeLogs(logs, false) }

// storeLogs appends logs; own: the leader's own commands (syncedLog.storeLogs).
func (g *guardedLog) storeLogs(logs []*walRecord, own bool) error {
	if g.leader != nil && !g.leader() {
		if err := g.disk.refuse(); err != nil {
			return err
		}
	}
	if stagetime.On() {
		return g.timedStore(logs, own)
	}
	return g.syncedLog.storeLogs(logs, own)
}
