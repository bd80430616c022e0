package pgconn

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/pgtest"
	"github.com/queen-mq/queen/internal/testkit"
)

// killsPerRun is how many kill trials share one broker, table and writer.
const killsPerRun = 5

// TestKill9DuringSnapshotAndStream: the broker process is killed with
// kill -9 at random points of a source's snapshot and of its stream while
// a writer updates, inserts and deletes rows, and started again on its
// data each time: twenty trials (QUEEN_TRIALS), in runs of five kills on
// one broker, the first two of a run during the snapshot. After each run
// the queue holds every change exactly once, in commit order per key.
func TestKill9DuringSnapshotAndStream(t *testing.T) {
	seed := time.Now().UnixNano()
	if s, err := strconv.ParseInt(os.Getenv("QUEEN_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (QUEEN_SEED repeats it)", seed)
	rng := rand.New(rand.NewSource(seed))
	n := trials(20, 5)
	total := n
	var snapKills, streamKills atomic.Int32
	for run := 0; n > 0; run++ {
		kills := min(n, killsPerRun)
		n -= kills
		runSeed := rng.Int63()
		t.Run(fmt.Sprint("run", run), func(t *testing.T) {
			t.Parallel()
			t.Logf("seed %d, %d kills", runSeed, kills)
			s, st := killRun(t, rand.New(rand.NewSource(runSeed)), fmt.Sprint("trial", run), kills)
			snapKills.Add(int32(s))
			streamKills.Add(int32(st))
		})
	}
	t.Cleanup(func() {
		t.Logf("kills during the snapshot: %d, during the stream: %d", snapKills.Load(), streamKills.Load())
		// Each run aims its first two kills at the snapshot, the rest at
		// the stream.
		if !t.Failed() && total >= 3 && (snapKills.Load() == 0 || streamKills.Load() == 0) {
			t.Errorf("the trials did not kill in both phases")
		}
	})
}

// killRun is one run; name is its connector's (and so its slot's) name,
// unique in the PostgreSQL cluster the runs share.
func killRun(t *testing.T, rng *rand.Rand, name string, kills int) (inSnapshot, inStream int) {
	const rows = 4000
	pg := pgtest.Shared(t)
	db := pg.NewDatabase(t)
	url := pg.URL(db)
	pg.Exec(t, db, fmt.Sprintf(`CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT g, 0 FROM generate_series(1, %d) g`, rows))
	n := startNodes(t, 1)[0]
	mustCall(t, "PUT", n.base()+"/api/v1/connectors/"+name, sourceDoc(pg, db, []M{{"table": "public.t", "queue": "t"}},
		M{"snapshotChunkRows": 200, "maxBundleMessages": 50, "lingerMs": 5}), 200)
	// The writer starts once the slot exists (the pointer is written):
	// from then on every change is in the stream.
	if err := testkit.CheckFor(60*time.Second, 10*time.Millisecond, func() error {
		v, ok := connector(n, name)
		if !ok || v.State == nil || len(v.State.Pointer) == 0 || string(v.State.Pointer) == "null" {
			return fmt.Errorf("no pointer yet: %+v", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	w := startLoad(url, rows, rand.New(rand.NewSource(rng.Int63())))
	for k := 0; k < kills; k++ {
		phase := killPoint(t, n, name, rng, k < 2)
		n.kill()
		if phase == "snapshot" {
			inSnapshot++
		} else {
			inStream++
		}
		t.Logf("kill %d: kill -9 in phase %s", k, phase)
		n.restart(t)
	}
	w.finish(t)
	pg.Exec(t, db, `INSERT INTO t VALUES (999999999, 0)`)
	checkHistory(t, drainUntil(t, []*proc{n}, "t", "check", "999999999", 2*time.Minute), w, "999999999")
	return inSnapshot, inStream
}

// killPoint waits for a random point to kill at: while snapshotting (after
// a random number of messages of this start, or as soon as the source
// streams if the snapshot ended first), or a random time into streaming.
// It returns the phase the source was in.
func killPoint(t *testing.T, n *proc, name string, rng *rand.Rand, snapshot bool) string {
	t.Helper()
	threshold := 100 + rng.Intn(1200)
	var phase string
	err := testkit.CheckFor(60*time.Second, 5*time.Millisecond, func() error {
		v, ok := connector(n, name)
		if !ok {
			return fmt.Errorf("no answer")
		}
		phase = v.Status.Phase
		switch {
		case v.Status.Phase == "error":
			t.Fatalf("source error %s: %s", v.Status.Code, v.Status.Message)
		case snapshot && v.Status.Phase == "snapshot" && v.Status.Messages >= threshold:
			return nil
		case v.Status.Phase == "streaming":
			return nil
		}
		return fmt.Errorf("phase %s, %d messages", v.Status.Phase, v.Status.Messages)
	})
	if err != nil {
		t.Fatal(err)
	}
	if phase == "streaming" {
		time.Sleep(time.Duration(50+rng.Intn(1000)) * time.Millisecond)
	}
	return phase
}
