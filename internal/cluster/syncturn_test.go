package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// A round that the append thread runs itself after writing a push on an
// idle syncer (syncturn.go) keeps every rule of a worker's: with its fsync
// held, the push is not answered; the leader goes on (a leasing pop is
// answered, a second push is written and its round runs beside on the
// other lane) and the second push's round does not count before the held
// one; when the held fsync fails, both pushes fail and the node stops.
func TestAlwaysIdleRoundKeepsTheRules(t *testing.T) {
	for _, size := range []int{3} {
		t.Run(fmt.Sprintf("%d nodes", size), func(t *testing.T) {
			seed := time.Now().UnixNano()
			t.Logf("seed %d", seed)
			vfss := make([]*laneVFS, size)
			tc := startClusterWith(t, size, func(i int, c *Config) {
				vfss[i] = newLaneVFS(seed+int64(i), 0)
				c.WALFS = vfss[i]
				c.Fsync, c.FsyncInterval = FsyncAlways, 10*time.Second
				c.SnapshotThreshold, c.SnapshotInterval = 1<<30, time.Hour
			})
			l := tc.leader()
			v := vfss[tc.indexOf(l)]
			s := l.fsync
			ctx := ctxT(t, 60*time.Second)
			if r := submitOK[*state.PushResult](t, ctx, l, pushN("q", "p", 0, 4)); r.Err != nil {
				t.Fatalf("push: %+v", r.Err)
			}
			tc.waitApplied(10 * time.Second)

			// Hold the next handle fsync until a push's round on an idle
			// syncer takes it (a worker may take one now and then, when a
			// round of the tick or a follower's ran: try again).
			hold := make(chan error)
			t.Cleanup(func() {
				select {
				case hold <- errors.New("the test ended"):
				case <-time.After(time.Second):
				}
			})
			var pushA <-chan submitted
			var idxA uint64
			for try := 0; ; try++ {
				if try == 20 {
					t.Fatal("no push's round ran on the writer in 20 tries")
				}
				waitIdle(t, s)
				idle0 := s.idle.Load()
				past := l.LastIndex()
				v.mu.Lock()
				v.hold = hold
				v.mu.Unlock()
				pushA = submitAsync(ctx, l, pushN("q", "p", 4+try, 5+try))
				select {
				case <-v.entered:
				case <-time.After(10 * time.Second):
					t.Fatal("the push's round did not fsync")
				}
				idxA = waitAppliedPast(t, l, past, "push A")
				if s.idle.Load() > idle0 {
					break
				}
				t.Logf("try %d: a worker ran the held round", try)
				hold <- nil
				if r := <-pushA; r.err != nil {
					t.Fatalf("push: %v", r.err)
				}
			}
			v.mu.Lock()
			ended := v.syncs
			v.mu.Unlock()

			// The node goes on: a leasing pop needs no fsync.
			popCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			pv, err := l.Submit(popCtx, leasePop("q", "g", 1, 60), 256)
			if err != nil {
				t.Fatalf("a leasing pop while a push's round is held on its writer: %v", err)
			}
			if r, ok := pv.(*state.PopResult); !ok || r.Err != nil || len(r.Messages) != 1 {
				t.Fatalf("pop: %#v", pv)
			}
			// A second push: its round runs beside the held one.
			pushB := submitAsync(ctx, l, pushN("q", "p2", 0, 1))
			if err := checkFor(10*time.Second, func() error {
				v.mu.Lock()
				defer v.mu.Unlock()
				if v.syncs == ended {
					return errors.New("no fsync ended beside the held one")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got := s.Synced(); got >= idxA {
				t.Fatalf("synced through %d while the round of the push at %d is held", got, idxA)
			}
			notYet(t, pushA, "the push whose round is held")
			notYet(t, pushB, "the push whose round ran beside the held one")

			hold <- errors.New("injected: the disk is gone")
			for what, ch := range map[string]<-chan submitted{"push A": pushA, "push B": pushB} {
				select {
				case r := <-ch:
					if r.err == nil {
						t.Fatalf("%s answered OK after the held fsync failed: %#v", what, r.v)
					}
					if !errors.Is(r.err, ErrStopped) {
						t.Fatalf("%s: %v; want the node's stop (ErrStopped)", what, r.err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: no answer after the held fsync failed", what)
				}
			}
			select {
			case <-l.Halted():
			case <-time.After(10 * time.Second):
				t.Fatal("the leader runs on after a failed fsync of its log")
			}
			if got := s.Synced(); got >= idxA {
				t.Fatalf("synced through %d after the round of the push at %d failed", got, idxA)
			}
		})
	}
}

// waitIdle waits until no lane of s is fsyncing.
func waitIdle(t *testing.T, s *logSyncer) {
	t.Helper()
	if err := checkFor(10*time.Second, func() error {
		s.rmu.Lock()
		defer s.rmu.Unlock()
		for i, busy := range s.laneBusy {
			if busy {
				return fmt.Errorf("lane %d is fsyncing", i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
