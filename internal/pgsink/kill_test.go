package pgsink

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	osexec "os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/testkit"
)

// The child process of TestKill9: a broker on a data directory with the
// sink running in it, as in the queen binary.
const (
	childEnv  = "QUEEN_PGSINK_CHILD"
	childN    = 100000
	childPart = 32
)

func sinkChild() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: os.Getenv("CHILD_DATA"), RaftAddr: os.Getenv("CHILD_RAFT"), NodeID: "n1"}, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open broker:", err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := b.WaitReady(wctx); err != nil {
		fmt.Fprintln(os.Stderr, "no leader:", err)
		return 1
	}
	if os.Getenv("CHILD_PUSH") != "" {
		// Transaction ids make a repeated push a duplicate, not new messages.
		var items []broker.PushItem
		for i := 0; i < childN; i++ {
			items = append(items, broker.PushItem{Queue: "nums", Partition: fmt.Sprintf("p%d", i%childPart), TxID: fmt.Sprintf("m-%d", i),
				Payload: []byte(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, pad[:120]))})
			if len(items) == 1000 {
				if _, err := b.Push(ctx, "default", items); err != nil {
					fmt.Fprintln(os.Stderr, "push:", err)
					return 1
				}
				items = items[:0]
			}
		}
		fmt.Println("pushed")
	}
	spec := sinkSpec("nums", "public.nums", "append")
	spec.Batch, spec.Workers, spec.LeaseSeconds = 500, 2, 5
	spec.ConsumerGroup = "pg-nums"
	m := &testMetrics{}
	r, err := New(connector.Env{Broker: b, Tenant: "default", NodeID: "n1", AllowPrivateNetworks: true, Log: log,
		Doc:    connector.Document{Name: "nums", Kind: connector.KindSink, Connection: connFor(os.Getenv("CHILD_DB")), Sink: spec},
		Status: connector.NewStatusReporter(connector.PhaseConnecting), Metrics: m.handles(), CPU: connector.NewPool(2)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	err = r.Run(ctx)
	b.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sink:", err)
		return 1
	}
	return 0
}

// TestKill9: the broker process is killed with SIGKILL three times in the
// middle of sinking 100,000 messages in append mode (no key to hide a
// duplicate) and started again on its data: the table ends with each
// message exactly once.
func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the kill -9 trial sinks 100,000 messages")
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	db := newDB(t)
	exec(t, db, `CREATE TABLE nums (n int, pad text)`)
	dir := filepath.Join(t.TempDir(), "data")
	raft := testkit.FreeAddr(t)
	start := func(pushFirst bool) *osexec.Cmd {
		cmd := osexec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=1", "CHILD_DATA="+dir, "CHILD_RAFT="+raft, "CHILD_DB="+db)
		if pushFirst {
			cmd.Env = append(cmd.Env, "CHILD_PUSH=1")
		}
		logf, err := os.Create(filepath.Join(t.TempDir(), "child.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() })
		return cmd
	}
	cmd := start(true)
	for k := 1; k <= 3; k++ {
		at := k*childN/4 + rng.IntN(childN/8) - childN/16
		waitFor(t, fmt.Sprintf("%d rows before kill %d", at, k), 3*time.Minute, func() error {
			if c := count(t, db, `SELECT count(*) FROM nums`); c < at {
				return fmt.Errorf("%d rows", c)
			}
			return nil
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		t.Logf("kill -9 at %d rows", count(t, db, `SELECT count(*) FROM nums`))
		cmd = start(false)
	}
	exactlyOnce(t, db, childN)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child after SIGTERM: %v", err)
	}
	exactlyOnce(t, db, childN)
}
