package pgconn

import (
	"context"
	"fmt"
	"math/rand"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// load is a writer on table t (id int PRIMARY KEY, v int NOT NULL) whose
// first rows 1..orig exist before the source starts: it updates original
// rows (v+1), inserts new rows (v 0) and deletes rows it inserted, in
// transactions of 1-10 changes, until stop is closed. It records what it
// did, for checkHistory; read the maps only after done.
type load struct {
	orig     int
	final    map[int]int // original keys: the number of updates made
	inserted map[int]int // keys the writer inserted: 0, or -1 once deleted
	txns     int
	stop     chan struct{}
	done     chan error
}

func startLoad(url string, orig int, rng *rand.Rand) *load {
	l := &load{orig: orig, final: map[int]int{}, inserted: map[int]int{}, stop: make(chan struct{}), done: make(chan error, 1)}
	go func() { l.done <- l.run(url, rng) }()
	return l
}

// finish stops the writer and waits for it.
func (l *load) finish(t testing.TB) {
	t.Helper()
	close(l.stop)
	if err := <-l.done; err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("the writer committed %d transactions", l.txns)
}

func (l *load) run(url string, rng *rand.Rand) error {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	next := 1000000
	var live []int
	for {
		select {
		case <-l.stop:
			return nil
		default:
		}
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		for j, n := 0, 1+rng.Intn(10); j < n; j++ {
			switch r := rng.Intn(6); {
			case r == 0:
				next++
				if _, err := tx.Exec(ctx, "INSERT INTO t VALUES ($1, 0)", next); err != nil {
					return err
				}
				l.inserted[next] = 0
				live = append(live, next)
			case r == 1 && len(live) > 0:
				i := rng.Intn(len(live))
				k := live[i]
				live = append(live[:i], live[i+1:]...)
				if _, err := tx.Exec(ctx, "DELETE FROM t WHERE id = $1", k); err != nil {
					return err
				}
				l.inserted[k] = -1
			default:
				k := 1 + rng.Intn(l.orig)
				if _, err := tx.Exec(ctx, "UPDATE t SET v = v + 1 WHERE id = $1", k); err != nil {
					return err
				}
				l.final[k]++
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		l.txns++
		time.Sleep(time.Duration(rng.Intn(15)) * time.Millisecond)
	}
}

// checkHistory checks the events of table t against what the writer did:
// no message id twice; per partition (lsn, seq) strictly ascending; every
// update of an original row exactly once and in order (v = 1, 2, ...), at
// most one snapshot row per key and never older than an event before it;
// every inserted row one c (and one d when deleted), a snapshot row only
// between them. The partition marker, if any, is ignored.
func checkHistory(t testing.TB, msgs []msg, l *load, marker string) {
	t.Helper()
	ids := map[string]bool{}
	byKey := map[string][]msg{}
	for _, m := range msgs {
		if ids[m.TransactionID] {
			t.Fatalf("message %s twice: %s", m.TransactionID, m.Data)
		}
		ids[m.TransactionID] = true
		if m.Partition != marker {
			byKey[m.Partition] = append(byKey[m.Partition], m)
		}
	}
	for part, list := range byKey {
		var lastLSN uint64
		lastSeq := -1
		for i, m := range list {
			lsn := lsnOf(t, m)
			if lsn < lastLSN || lsn == lastLSN && m.ev.Seq <= lastSeq {
				dump(t, list)
				t.Fatalf("partition %s: event %d (lsn %s seq %d) after lsn %X seq %d", part, i, m.ev.LSN, m.ev.Seq, lastLSN, lastSeq)
			}
			lastLSN, lastSeq = lsn, m.ev.Seq
			if got := string(m.ev.Key["id"]); got != part {
				t.Fatalf("partition %s holds an event of key %s: %s", part, got, m.Data)
			}
		}
	}
	vOf := func(m msg) int {
		v, err := strconv.Atoi(string(m.ev.After["v"]))
		if err != nil {
			t.Fatalf("no v in %s", m.Data)
		}
		return v
	}
	for k := 1; k <= l.orig; k++ {
		list := byKey[strconv.Itoa(k)]
		snaps, lastU, lastV := 0, 0, -1
		for _, m := range list {
			switch m.ev.Op {
			case "r":
				snaps++
				v := vOf(m)
				if v < lastV {
					dump(t, list)
					t.Fatalf("key %d: snapshot row v=%d after an event with v=%d (older after newer)", k, v, lastV)
				}
				lastV = v
			case "u":
				v := vOf(m)
				if v != lastU+1 || v < lastV {
					dump(t, list)
					t.Fatalf("key %d: update to v=%d after updates up to %d and an event with v=%d (lost, repeated or reordered)", k, v, lastU, lastV)
				}
				lastU, lastV = v, v
			default:
				t.Fatalf("key %d: unexpected %s", k, m.Data)
			}
		}
		if snaps > 1 {
			dump(t, list)
			t.Fatalf("key %d: %d snapshot rows", k, snaps)
		}
		if lastU != l.final[k] {
			dump(t, list)
			t.Fatalf("key %d: updates reach v=%d, the writer made %d", k, lastU, l.final[k])
		}
		if l.final[k] == 0 && snaps != 1 {
			t.Fatalf("key %d: never updated, but %d snapshot rows", k, snaps)
		}
	}
	for k, v := range l.inserted {
		var ops []string
		snaps := 0
		for _, m := range byKey[strconv.Itoa(k)] {
			if m.ev.Op == "r" {
				// A row inserted before its chunk was read may come as
				// one r too, after its c and before its d.
				if snaps++; snaps > 1 || len(ops) != 1 {
					dump(t, byKey[strconv.Itoa(k)])
					t.Fatalf("key %d: a snapshot row out of place", k)
				}
				continue
			}
			ops = append(ops, m.ev.Op)
		}
		want := "c"
		if v < 0 {
			want = "c d"
		}
		if got := fmt.Sprint(ops); got != "["+want+"]" {
			dump(t, byKey[strconv.Itoa(k)])
			t.Fatalf("key %d: events %s, want [%s]", k, got, want)
		}
	}
	for part := range byKey {
		k, err := strconv.Atoi(part)
		if err != nil || k > l.orig {
			if _, ok := l.inserted[k]; !ok {
				t.Fatalf("events in partition %q, a key nobody wrote", part)
			}
		}
	}
}

func dump(t testing.TB, list []msg) {
	t.Helper()
	for _, m := range list {
		t.Logf("  %s %s", m.TransactionID, m.Data)
	}
}
