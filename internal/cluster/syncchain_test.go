package cluster

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// A worker woken for the leader's own appends (kickOwn) after a round
// began that covers them runs no round of its own: before, a third of the
// rounds under a push load found nothing to fsync and still waited for the
// round before them (docs/benchmarks.md, session 13).
func TestAlwaysCoveredOwnDemandRunsNoRound(t *testing.T) {
	v := newLaneVFS(1, 0)
	s, log := openLaneLog(t, v)
	if err := log.storeLogs([]*walRecord{durableEntry(1)}, true); err != nil {
		t.Fatal(err)
	}
	if err := checkFor(10*time.Second, func() error {
		if got := s.Synced(); got < 1 {
			return fmt.Errorf("synced = %d; want 1", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The demand's round may still be ending (or chaining): wait for the
	// workers to be idle.
	waitIdle(t, s)
	begins, skipped := s.begins.Load(), s.skipped.Load()
	s.kickOwn <- struct{}{} // a late wake-up of a worker: nothing is uncovered
	if err := checkFor(10*time.Second, func() error {
		if s.skipped.Load() == skipped {
			return errors.New("the demand was not taken")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := s.begins.Load(); got != begins {
		t.Fatalf("%d rounds began for a demand whose appends a round had covered; want none", got-begins)
	}
}

// A worker whose round ends while the leader's own appends written during
// its fsync are covered by no round runs their round itself, without a
// demand: here the second append asks for none (as when the demand's
// worker is still waiting for a CPU), and with the interval at 10 s only
// the chained round can sync it.
func TestAlwaysRoundEndingUncoveredRunsTheNext(t *testing.T) {
	v := newLaneVFS(1, 0)
	s, log := openLaneLog(t, v)
	if err := log.storeLogs([]*walRecord{durableEntry(1)}, false); err != nil {
		t.Fatal(err)
	}
	hold := v.holdNext(t)
	if err := log.storeLogs([]*walRecord{durableEntry(2)}, true); err != nil {
		t.Fatal(err)
	}
	v.awaitEntered(t, "the demanded round's fsync did not begin")
	// Entry 3 is written during the held fsync, and demands nothing.
	s.writerSyncs = true
	if err := log.storeLogs([]*walRecord{durableEntry(3)}, true); err != nil {
		t.Fatal(err)
	}
	w3 := v.writeSeq()
	if got := s.Synced(); got != 1 {
		t.Fatalf("synced = %d while the round of entry 2 is held; want 1", got)
	}
	hold <- nil
	if err := checkFor(5*time.Second, func() error {
		if got := s.Synced(); got < 3 {
			return fmt.Errorf("synced = %d; want 3", got)
		}
		return nil
	}); err != nil {
		t.Fatalf("the round ending with entry 3 uncovered did not run its round: %v", err)
	}
	if u := v.uncovered(); u != 0 && u <= w3 {
		t.Fatalf("write %d (of entries through 3) covered by no fsync after synced reached 3", u)
	}
}
