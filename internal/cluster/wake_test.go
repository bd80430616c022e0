package cluster

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	walfs "github.com/hashicorp/raft-wal/fs"
	waltypes "github.com/hashicorp/raft-wal/types"

	"github.com/queen-mq/queen/internal/state"
)

// TestPushWakesPopsBeforeItsFsync: the leader wakes the long-polling pops
// of a queue as soon as a push to it is in its log, while the push's
// fsync still runs, so that a pop proposed then is written right behind
// it. The push itself is answered only after its fsync, and the state
// machine wakes the queue again when it applies the push. (Before, the
// only wake came from the apply, after the fsync.)
func TestPushWakesPopsBeforeItsFsync(t *testing.T) {
	gate := &gateVFS{VFS: walfs.New(), entered: make(chan struct{}, 1)}
	var mu sync.Mutex
	woken := map[state.Wake]int{}
	wakes := make(chan struct{}, 16)
	tc := startClusterWith(t, 1, func(i int, c *Config) {
		c.WALFS = gate
		c.Fsync = FsyncAlways
		c.OnWake = func(ws []state.Wake, _ []uint64) {
			mu.Lock()
			for _, w := range ws {
				woken[w]++
			}
			mu.Unlock()
			select {
			case wakes <- struct{}{}:
			default:
			}
		}
	})
	n := tc.leader()
	ctx := ctxT(t, 30*time.Second)
	want := state.Wake{Tenant: "default", Queue: "wq"}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return woken[want]
	}
	push := &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "wq", Partition: "p", TxID: "t1", Payload: []byte(`1`)}}}
	release := gate.arm()
	res := make(chan error, 1)
	go func() {
		_, err := n.Submit(ctx, push, 64)
		res <- err
	}()
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		release()
		t.Fatal("the push's fsync never started")
	}
	// The fsync is held: the queue's waiters must be woken meanwhile.
	if err := checkFor(5*time.Second, func() error {
		if c := count(); c < 1 {
			return errNotYet("the queue was not woken while the push's fsync ran")
		}
		return nil
	}); err != nil {
		release()
		t.Fatal(err)
	}
	select {
	case err := <-res:
		release()
		t.Fatalf("the push was answered before its fsync ended (err %v)", err)
	default:
	}
	release()
	if err := <-res; err != nil {
		t.Fatalf("push: %v", err)
	}
	// The apply wakes it once more.
	if err := checkFor(5*time.Second, func() error {
		if c := count(); c < 2 {
			return errNotYet("the apply did not wake the queue")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }

// stackVFS is raft-wal's file system recording, once armed, the stack of
// the goroutine of every segment write.
type stackVFS struct {
	waltypes.VFS
	mu     sync.Mutex
	armed  bool
	stacks []string
}

func (v *stackVFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return &stackFile{WritableFile: f, v: v}, nil
}

func (v *stackVFS) OpenWriter(dir, name string) (waltypes.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return &stackFile{WritableFile: f, v: v}, nil
}

func (v *stackVFS) record(s *[]string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.armed {
		*s = append(*s, goroutineStack())
	}
}

type stackFile struct {
	waltypes.WritableFile
	v *stackVFS
}

func (f *stackFile) WriteAt(p []byte, off int64) (int, error) {
	f.v.record(&f.v.stacks)
	return f.WritableFile.WriteAt(p, off)
}

func goroutineStack() string {
	buf := make([]byte, 16<<10)
	return string(buf[:runtime.Stack(buf, false)])
}

// TestOneNodeIntervalWritesOnTheLoop: on a single member under
// FsyncInterval the ready loop writes a write's log entry itself, with no
// hand-over to the append thread and back, and the write is answered with
// its result. (Before, every write went loop → append thread → loop.)
func TestOneNodeIntervalWritesOnTheLoop(t *testing.T) {
	wal := &stackVFS{VFS: walfs.New()}
	tc := startClusterWith(t, 1, func(i int, c *Config) {
		c.WALFS = wal
		c.Fsync = FsyncInterval
	})
	n := tc.leader()
	ctx := ctxT(t, 30*time.Second)
	wal.mu.Lock()
	wal.armed = true
	wal.mu.Unlock()
	const pushes = 20
	for i := range pushes {
		v, err := n.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: fmt.Sprintf("t%d", i), Payload: []byte(`1`)}}}, 64)
		if err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
		if r, ok := v.(*state.PushResult); !ok || len(r.Items) != 1 || r.Items[0].Duplicate {
			t.Fatalf("push %d: result %#v, want one new item", i, v)
		}
	}
	wal.mu.Lock()
	writes := slices.Clone(wal.stacks)
	wal.mu.Unlock()
	if len(writes) < pushes {
		t.Fatalf("%d log writes recorded for %d pushes", len(writes), pushes)
	}
	for i, s := range writes {
		if strings.Contains(s, "runAppend") || !strings.Contains(s, "appendHere") {
			t.Fatalf("log write %d of %d did not run on the ready loop:\n%s", i, len(writes), s)
		}
	}
}

// TestOneNodeAlwaysBareAppendsOnTheLoop: on a single member under
// FsyncAlways the append raft emits after each commit writes nothing, and
// the ready loop delivers its answer itself: sequential pushes hand the
// append thread no message. (Before, each commit's append went loop →
// append thread → loop, and the next push's entry then found the append
// thread busy and followed it there.)
func TestOneNodeAlwaysBareAppendsOnTheLoop(t *testing.T) {
	tc := startClusterWith(t, 1, func(i int, c *Config) { c.Fsync = FsyncAlways })
	n := tc.leader()
	ctx := ctxT(t, 30*time.Second)
	push := func(i int) {
		t.Helper()
		v, err := n.Submit(ctx, &state.Push{Tenant: "default", Items: []state.PushItem{{Queue: "q", Partition: "p", TxID: fmt.Sprintf("t%d", i), Payload: []byte(`1`)}}}, 64)
		if err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
		if r, ok := v.(*state.PushResult); !ok || len(r.Items) != 1 || r.Items[0].Duplicate {
			t.Fatalf("push %d: result %#v, want one new item", i, v)
		}
	}
	push(0)
	for n.appendQueued.Load() != 0 {
		runtime.Gosched()
	}
	before := n.appendTaken.Load()
	const pushes = 20
	for i := 1; i <= pushes; i++ {
		push(i)
	}
	if got := n.appendTaken.Load() - before; got != 0 {
		t.Fatalf("the append thread took %d appends during %d sequential pushes, want 0", got, pushes)
	}
}
