package cluster

import (
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	walfs "github.com/hashicorp/raft-wal/fs"
	waltypes "github.com/hashicorp/raft-wal/types"

	"github.com/queen-mq/queen/internal/state"
)

// laneVFS is the OS's file system with sync handles (so the syncer runs two
// lanes) that records the order of writes and fsyncs: every write gets a
// sequence number, and an fsync that ends without an error covers the
// writes of its file numbered before it began, nothing later. Its fsyncs
// take a random time (so they overlap), and one can be held and failed.
type laneVFS struct {
	waltypes.VFS
	rng   *rand.Rand
	delay time.Duration // an fsync takes up to this long

	mu       sync.Mutex
	seq      uint64
	writes   map[*laneFile][]uint64 // each file's write numbers not covered yet
	byName   map[string]*laneFile   // the file opened last under each name
	inFlight int
	maxIn    int
	overlaps int        // fsyncs begun while another ran
	syncs    int        // fsyncs ended
	hold     chan error // the next handle fsync waits for an error (or nil) from it
	entered  chan struct{}
}

func newLaneVFS(seed int64, delay time.Duration) *laneVFS {
	return &laneVFS{VFS: walfs.New(), rng: rand.New(rand.NewSource(seed)), delay: delay,
		writes: map[*laneFile][]uint64{}, byName: map[string]*laneFile{}, entered: make(chan struct{}, 16)}
}

// holdNext makes the next handle fsync wait until the test ends (or sends
// on the channel it returns), and returns that channel.
func (v *laneVFS) holdNext(t *testing.T) chan error {
	t.Helper()
	hold := make(chan error)
	v.mu.Lock()
	v.hold = hold
	v.mu.Unlock()
	t.Cleanup(func() { // a failed check leaves the fsync held: let the log close
		select {
		case hold <- errors.New("the test ended"):
		case <-time.After(time.Second):
		}
	})
	return hold
}

// awaitEntered waits for a held fsync to begin.
func (v *laneVFS) awaitEntered(t *testing.T, what string) {
	t.Helper()
	select {
	case <-v.entered:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

type laneFile struct {
	waltypes.WritableFile
	v *laneVFS
}

func (v *laneVFS) Create(dir, name string, size uint64) (waltypes.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return v.track(f, dir, name), nil
}

func (v *laneVFS) OpenWriter(dir, name string) (waltypes.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return v.track(f, dir, name), nil
}

func (v *laneVFS) track(f waltypes.WritableFile, dir, name string) *laneFile {
	lf := &laneFile{WritableFile: f, v: v}
	v.mu.Lock()
	v.byName[dir+"/"+name] = lf
	v.writes[lf] = nil
	v.mu.Unlock()
	return lf
}

// OpenSync opens a handle whose fsync covers what the file of that name
// (opened just before) had written when it began.
func (v *laneVFS) OpenSync(dir, name string) (syncHandle, error) {
	v.mu.Lock()
	f := v.byName[dir+"/"+name]
	v.mu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("a sync handle on %s/%s, which is not open", dir, name)
	}
	h, err := osSyncFS{}.OpenSync(dir, name)
	if err != nil {
		return nil, err
	}
	return &laneHandle{h: h, f: f}, nil
}

func (f *laneFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.WritableFile.WriteAt(p, off)
	f.v.mu.Lock()
	f.v.seq++
	f.v.writes[f] = append(f.v.writes[f], f.v.seq)
	f.v.mu.Unlock()
	return n, err
}

func (f *laneFile) Sync() error {
	return f.v.fsync(f, f.WritableFile.Sync, false)
}

type laneHandle struct {
	h syncHandle
	f *laneFile
}

func (h *laneHandle) Sync() error { return h.f.v.fsync(h.f, h.h.Sync, true) }

func (h *laneHandle) Close() error { return h.h.Close() }

// fsync runs sync as an fsync of f that began now; holdable: it may be
// held (a handle's, not raft-wal's own).
func (v *laneVFS) fsync(f *laneFile, sync func() error, holdable bool) error {
	v.mu.Lock()
	begun := v.seq
	v.inFlight++
	if v.inFlight > 1 {
		v.overlaps++
	}
	v.maxIn = max(v.maxIn, v.inFlight)
	d := time.Duration(v.rng.Int63n(int64(v.delay) + 1))
	var hold chan error
	if holdable {
		hold, v.hold = v.hold, nil
	}
	v.mu.Unlock()
	var err error
	if hold != nil {
		v.entered <- struct{}{}
		err = <-hold
	} else {
		time.Sleep(d)
	}
	if err == nil {
		err = sync()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.inFlight--
	v.syncs++
	if err != nil {
		return err
	}
	// Covered: f's writes numbered up to begun.
	ws := v.writes[f]
	k := 0
	for k < len(ws) && ws[k] <= begun {
		k++
	}
	v.writes[f] = ws[k:]
	return nil
}

// uncovered is the lowest write number no fsync covers yet (0: none).
func (v *laneVFS) uncovered() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	var low uint64
	for _, ws := range v.writes {
		if len(ws) > 0 && (low == 0 || ws[0] < low) {
			low = ws[0]
		}
	}
	return low
}

func (v *laneVFS) writeSeq() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.seq
}

// openLaneLog opens a raft log under FsyncAlways on a laneVFS, with
// segments small enough to rotate in a test.
func openLaneLog(t *testing.T, v *laneVFS) (*logSyncer, *syncedLog) {
	t.Helper()
	s := newLogSyncer(FsyncAlways, 10*time.Second, quietLogger())
	s.walVFS = v
	wal, err := s.openWAL(t.TempDir(), 256<<10)
	if err != nil {
		t.Fatal(err)
	}
	if s.lanes != syncLanes {
		t.Fatalf("%d sync lanes on a file system with sync handles; want %d", s.lanes, syncLanes)
	}
	t.Cleanup(func() {
		s.close()
		wal.Close()
	})
	return s, &syncedLog{WAL: wal, s: s}
}

// With two sync lanes, the synced index (which releases the replies that
// promise durability, replies.go) never names an entry any of whose writes
// is not covered by an fsync that began after it was written and ended
// without an error. The leader's own appends demand rounds while others run
// (their fsyncs take a random time up to 2 ms), so rounds overlap; other
// appends sync on the writer, lease-only ones defer, and segments rotate.
func TestAlwaysOverlappingRoundsCountOnlyCoveredWrites(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	v := newLaneVFS(seed, 2*time.Millisecond)
	s, log := openLaneLog(t, v)

	const entries = 1500
	written := make([]uint64, entries+1) // the write number after each entry's append
	type check struct{ synced, uncovered uint64 }
	var (
		mu     sync.Mutex
		checks []check
	)
	s.onSynced = func() {
		// Read the index first: coverage only grows.
		c := check{synced: s.Synced()}
		c.uncovered = v.uncovered()
		mu.Lock()
		checks = append(checks, c)
		mu.Unlock()
	}
	var published sync.Mutex // written[i] is set before i may be read
	for i := uint64(1); i <= entries; i++ {
		e := durableEntry(i)
		own := true
		switch r := rng.Intn(20); {
		case r == 0:
			own = false // synced on the writer, beside the syncer's rounds
		case r < 4:
			e = leaseEntry(i)
		}
		published.Lock()
		if err := log.storeLogs([]*walRecord{e}, own); err != nil {
			published.Unlock()
			t.Fatalf("append %d: %v", i, err)
		}
		written[i] = v.writeSeq()
		published.Unlock()
		if rng.Intn(3) == 0 {
			time.Sleep(time.Duration(rng.Intn(500)) * time.Microsecond)
		}
	}
	// The last entry may be a lease: one more round covers it.
	if err := checkFor(10*time.Second, func() error {
		if got := s.Synced(); got < entries {
			s.demand()
			return fmt.Errorf("synced through %d of %d", got, entries)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	published.Lock()
	defer published.Unlock()
	mu.Lock()
	defer mu.Unlock()
	for _, c := range checks {
		if c.synced == 0 {
			continue
		}
		if w := written[c.synced]; c.uncovered != 0 && c.uncovered <= w {
			t.Fatalf("synced through %d, whose writes end at number %d, while write %d was covered by no fsync", c.synced, w, c.uncovered)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	t.Logf("%d entries, %d synced-index checks, %d fsyncs, %d begun while another ran (at most %d at once), %d rounds", entries, len(checks), v.syncs, v.overlaps, v.maxIn, s.rounds.Load())
	if v.overlaps == 0 || v.maxIn < 2 {
		t.Fatalf("no two fsyncs ran at once (%d overlaps, at most %d): the test did not overlap rounds", v.overlaps, v.maxIn)
	}
}

// A round whose fsync succeeds beside an earlier round whose fsync then
// fails records nothing: rounds count in the order they began, and after a
// failed fsync none does, so the entry the later round covered is never
// reported synced, and the log takes no more appends.
func TestAlwaysFailedFsyncBesideAnOverlapCountsNoLaterRound(t *testing.T) {
	v := newLaneVFS(1, 0)
	s, log := openLaneLog(t, v)
	if err := log.storeLogs([]*walRecord{durableEntry(1)}, false); err != nil {
		t.Fatal(err)
	}
	if s.Synced() != 1 {
		t.Fatalf("synced = %d after a synced append; want 1", s.Synced())
	}

	// Round A's fsync (of entry 2) is held; round B (entry 3) runs beside it.
	hold := v.holdNext(t)
	if err := log.storeLogs([]*walRecord{durableEntry(2)}, true); err != nil {
		t.Fatal(err)
	}
	v.awaitEntered(t, "the demanded round's fsync did not begin")
	v.mu.Lock()
	before := v.syncs
	v.mu.Unlock()
	if err := log.storeLogs([]*walRecord{durableEntry(3)}, true); err != nil {
		t.Fatal(err)
	}
	if err := checkFor(10*time.Second, func() error {
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.syncs == before {
			return errors.New("round B's fsync has not ended")
		}
		return nil
	}); err != nil {
		t.Fatalf("a second round did not run beside the held one: %v", err)
	}
	if got := s.Synced(); got != 1 {
		t.Fatalf("synced = %d while the round begun before is still fsyncing; want 1", got)
	}
	hold <- errors.New("injected: the disk is gone")
	if err := checkFor(10*time.Second, func() error {
		if s.failed.Load() == nil {
			return errors.New("no failure recorded")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Once B (the last round begun) has ended, it must not have counted.
	s.rmu.Lock()
	last := s.last
	s.rmu.Unlock()
	select {
	case <-last.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the round beside the failed one did not end")
	}
	if last.err == nil {
		t.Errorf("the round begun after the failed one ended without an error")
	}
	if got := s.Synced(); got != 1 {
		t.Fatalf("synced = %d after the earlier round's fsync failed; want 1", got)
	}
	if err := log.storeLogs([]*walRecord{durableEntry(4)}, false); err == nil {
		t.Fatal("an append after a failed fsync succeeded")
	}
}

// On real clusters whose leader syncs on two lanes (fsyncs of random
// length up to 1 ms, four writers), no push is answered OK before every
// write the leader's log made before the push was submitted is covered by
// an fsync that began after it: those writes hold the entries before the
// push's, which its reply waits for (replies.go). Also that two of the
// leader's fsyncs ran at once.
func TestAlwaysNoReplyBeforeACoveringFsync(t *testing.T) {
	for _, size := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d nodes", size), func(t *testing.T) {
			seed := time.Now().UnixNano()
			t.Logf("seed %d", seed)
			vfss := make([]*laneVFS, size)
			tc := startClusterWith(t, size, func(i int, c *Config) {
				vfss[i] = newLaneVFS(seed+int64(i), time.Millisecond)
				c.WALFS = vfss[i]
				c.Fsync, c.FsyncInterval = FsyncAlways, 10*time.Second
				c.SnapshotThreshold, c.SnapshotInterval = 1<<30, time.Hour
			})
			l := tc.leader()
			v := vfss[tc.indexOf(l)]
			ctx := ctxT(t, 60*time.Second)
			var (
				wg     sync.WaitGroup
				mu     sync.Mutex
				acked  int
				errs   []string
				cutoff = time.Now().Add(1500 * time.Millisecond)
			)
			for w := 0; w < 4; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					part := fmt.Sprintf("w%d", w)
					for i := 0; time.Now().Before(cutoff); i++ {
						before := v.writeSeq()
						res, err := l.Submit(ctx, pushN("q", part, i, i+1), 64)
						low := v.uncovered()
						r, _ := res.(*state.PushResult)
						mu.Lock()
						if err != nil || r == nil || r.Err != nil {
							errs = append(errs, fmt.Sprintf("push %s-%d: %v, %+v", part, i, err, res))
						} else if acked++; low != 0 && low <= before {
							errs = append(errs, fmt.Sprintf("push %s-%d answered while write %d, made before it was submitted (writes then: %d), was covered by no fsync", part, i, low, before))
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			for _, e := range errs {
				t.Error(e)
			}
			v.mu.Lock()
			defer v.mu.Unlock()
			t.Logf("%d pushes answered; the leader: %d fsyncs, %d begun while another ran (at most %d at once)", acked, v.syncs, v.overlaps, v.maxIn)
			if acked == 0 {
				t.Fatal("no push answered")
			}
			if v.overlaps == 0 || v.maxIn < 2 {
				t.Fatalf("no two of the leader's fsyncs ran at once (%d overlaps, at most %d): the test did not overlap rounds", v.overlaps, v.maxIn)
			}
		})
	}
}
