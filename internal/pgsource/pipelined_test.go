package pgsource

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// pipeTxns is a txn hook that hands the first two bundles with messages
// (a, then b, in the order the committer proposes them) to the test:
// onA runs in place of a's transaction, and b's first attempt is reported
// on bDone. Everything else is proposed as usual.
type pipeTxns struct {
	mu       sync.Mutex
	seen     int
	order    map[*pointer]int // 1 = a, 2 = b
	attempts map[int]int      // proposals per bundle
	bDone    chan error
	onA      func(queued func(), do func() error) error
}

func newPipeTxns(onA func(queued func(), do func() error) error) *pipeTxns {
	return &pipeTxns{order: map[*pointer]int{}, attempts: map[int]int{}, bDone: make(chan error, 1), onA: onA}
}

func (p *pipeTxns) hook(msgs int, ptr *pointer, queued func(), do func() error) error {
	if msgs == 0 {
		return do()
	}
	p.mu.Lock()
	// A bundle proposed again keeps its place: it is known by its pointer.
	n, ok := p.order[ptr]
	if !ok && p.seen < 2 {
		p.seen++
		n = p.seen
		p.order[ptr] = n
	}
	p.attempts[n]++
	first := p.attempts[n] == 1
	p.mu.Unlock()
	switch {
	case n == 1 && first:
		return p.onA(queued, do)
	case n == 2 && first:
		err := do()
		p.bDone <- err
		return err
	}
	return do()
}

// waitB waits for b's first transaction to return.
func (p *pipeTxns) waitB(t *testing.T) error {
	select {
	case err := <-p.bDone:
		return err
	case <-time.After(30 * time.Second):
		t.Error("the second bundle was not proposed while the first was in flight")
		return errors.New("not proposed")
	}
}

// pipeSource streams four transactions of 10 rows into a queue, bundles
// of at most 10 messages, with h; it returns what the test needs to check
// the queue afterwards.
func pipeSource(t *testing.T, name string, h *hooks) (*running, func(*hooks) *running, func()) {
	s, db := ordersSource(t)
	s.Exec(t, db, fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY)", name))
	b := openBroker(t, "")
	t.Cleanup(func() { b.Close() })
	doc := sourceDoc(s, db, name, connector.TableSpec{Table: "public." + name, Queue: name})
	doc.Source.Snapshot = "never"
	doc.Source.MaxBundleMessages = 10
	src := startSource(t, b, doc, "n1", h)
	src.waitPhase(t, connector.PhaseStreaming)
	for i := 0; i < 4; i++ {
		s.Exec(t, db, fmt.Sprintf("INSERT INTO %s SELECT g FROM generate_series(%d, %d) g", name, 1+10*i, 10+10*i))
	}
	restart := func(h *hooks) *running { return startSource(t, b, doc, "n1", h) }
	check := func() {
		t.Helper()
		evs := drain(t, b, name, "g", 40)
		seen := map[string]bool{}
		for _, g := range evs {
			if seen[g.msg.Partition] {
				t.Fatalf("row %s twice", g.msg.Partition)
			}
			seen[g.msg.Partition] = true
		}
		if len(seen) != 40 {
			t.Fatalf("%d rows, want 40", len(seen))
		}
	}
	return src, restart, check
}

// TestBundlesPipelined: while the broker's answer to one bundle's
// transaction is outstanding, the next bundle is proposed and commits
// (its pointer write conditioned on the value the first one writes), and
// every row arrives once.
func TestBundlesPipelined(t *testing.T) {
	var p *pipeTxns
	p = newPipeTxns(func(_ func(), do func() error) error {
		if err := do(); err != nil {
			return err
		}
		// The first is committed; its answer waits until the second
		// committed too.
		if err := p.waitB(t); err != nil {
			t.Errorf("the second bundle, proposed while the first was unanswered: %v", err)
		}
		return nil
	})
	src, _, check := pipeSource(t, "piped", &hooks{txn: p.hook, depth: 2})
	check()
	if st := src.status.Get(); st.Phase != connector.PhaseStreaming {
		t.Fatalf("phase %s (%s) after the pipelined bundles, want streaming", st.Phase, st.Message)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.attempts[1] != 1 || p.attempts[2] != 1 {
		t.Fatalf("proposals of the first two bundles: %v, want one each", p.attempts)
	}
}

// TestPipelinedFailureLosesNothing: the first bundle's transaction fails
// after the second was proposed behind it. The second, conditioned on the
// pointer the first would have written, fails too (nothing of it is
// written), the run stops, and the next run delivers every row once.
func TestPipelinedFailureLosesNothing(t *testing.T) {
	var p *pipeTxns
	var bErr error
	p = newPipeTxns(func(queued func(), _ func() error) error {
		// As if queued for the log and then lost: the second goes.
		queued()
		bErr = p.waitB(t)
		return errCrash
	})
	src, restart, check := pipeSource(t, "pipefail", &hooks{txn: p.hook, depth: 2})
	select {
	case err := <-src.done:
		close(src.done)
		if !errors.Is(err, errCrash) {
			t.Fatalf("first run ended with %v, want the injected failure", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the run did not stop at the failed bundle")
	}
	var be *broker.Error
	if !errors.As(bErr, &be) || be.Code != "condition_failed" {
		t.Fatalf("the bundle behind the failed one returned %v, want condition_failed", bErr)
	}
	restart(nil)
	check()
}

// TestPipelinedReorderProposedAgain: the second bundle's transaction is
// applied before the first's (as after a leader change). Its condition
// fails, the first commits, and the committer proposes the second again,
// on the first's version, within the same run: every row once, no restart.
func TestPipelinedReorderProposedAgain(t *testing.T) {
	var p *pipeTxns
	var bErr error
	p = newPipeTxns(func(queued func(), do func() error) error {
		queued()
		bErr = p.waitB(t)
		return do()
	})
	src, _, check := pipeSource(t, "pipeorder", &hooks{txn: p.hook, depth: 2})
	check()
	var be *broker.Error
	if !errors.As(bErr, &be) || be.Code != "condition_failed" {
		t.Fatalf("the second bundle, applied first, returned %v, want condition_failed", bErr)
	}
	if st := src.status.Get(); st.Phase != connector.PhaseStreaming {
		t.Fatalf("phase %s (%s) after the reordered bundles, want streaming", st.Phase, st.Message)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.attempts[2] != 2 {
		t.Fatalf("the second bundle was proposed %d times, want twice", p.attempts[2])
	}
}
