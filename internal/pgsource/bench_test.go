package pgsource

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestBenchSource measures the source against PostgreSQL's own limits on
// this machine (make bench-source): snapshot rows/s against COPY of the
// same table, streaming changes/s against pg_recvlogical reading the same
// WAL with pgoutput, and commit-to-consumer latency at 10,000 changes/s.
// It runs only with QUEEN_BENCH_SOURCE=1.
func TestBenchSource(t *testing.T) {
	if os.Getenv("QUEEN_BENCH_SOURCE") == "" {
		t.Skip("a benchmark: make bench-source runs it (QUEEN_BENCH_SOURCE=1)")
	}
	rows := 200000
	if n, err := strconv.Atoi(os.Getenv("QUEEN_BENCH_ROWS")); err == nil && n > 0 {
		rows = n
	}
	s, db := ordersSource(t)
	ctx := context.Background()
	// Rows of about 200 bytes.
	const ddl = `CREATE TABLE b (id bigint PRIMARY KEY, name text NOT NULL, n int NOT NULL, at timestamptz NOT NULL DEFAULT now());`
	const fill = `INSERT INTO b SELECT g, repeat(md5(g::text), 5), g %% 1000, now() FROM generate_series(%d, %d) g`
	s.Exec(t, db, ddl)
	s.Exec(t, db, fmt.Sprintf(fill, 1, rows))
	s.Exec(t, db, "VACUUM ANALYZE b")
	c := s.Connect(t, db)

	// COPY of the same table.
	start := time.Now()
	if _, err := c.PgConn().CopyTo(ctx, io.Discard, "COPY (SELECT * FROM b ORDER BY id) TO STDOUT"); err != nil {
		t.Fatal(err)
	}
	copyRate := float64(rows) / time.Since(start).Seconds()

	b := openBroker(t, "")
	defer b.Close()
	doc := sourceDoc(s, db, "bench", connector.TableSpec{Table: "public.b", Queue: "b"})
	start = time.Now()
	src := startSource(t, b, doc, "n1", nil)
	waitMessages(t, src, uint64(rows), 10*time.Minute)
	snapRate := float64(rows) / time.Since(start).Seconds()

	// Streaming: a second slot reads the same WAL with pg_recvlogical.
	s.Exec(t, db, "SELECT pg_create_logical_replication_slot('bench_recv', 'pgoutput')")
	start = time.Now()
	s.Exec(t, db, fmt.Sprintf(fill, rows+1, 2*rows))
	waitMessages(t, src, uint64(2*rows), 10*time.Minute)
	streamRate := float64(rows) / time.Since(start).Seconds()
	var end string
	if err := c.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	recvRate := 0.0
	if path, err := exec.LookPath("pg_recvlogical"); err == nil {
		start = time.Now()
		cmd := exec.Command(path, "-d", s.URL(db), "--slot", "bench_recv", "--start", "--endpos", end, "--no-loop",
			"-o", "proto_version=1", "-o", "publication_names=queen_bench", "-f", "/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("pg_recvlogical: %v: %s", err, out)
		} else {
			recvRate = float64(rows) / time.Since(start).Seconds()
		}
	}
	s.Exec(t, db, "SELECT pg_drop_replication_slot('bench_recv')")

	p50, p99 := latency(t, s.URL(db), b, 2*rows)
	t.Logf("\n%-34s %12s %12s %7s\n%-34s %12.0f %12.0f %7.2f\n%-34s %12.0f %12.0f %7.2f\n%-34s %12s %12s\n",
		"rows of ~200 bytes", "queen", "postgres", "ratio",
		fmt.Sprintf("snapshot rows/s (vs COPY), %d", rows), snapRate, copyRate, snapRate/copyRate,
		"streaming changes/s (vs pg_recvlogical)", streamRate, recvRate, streamRate/max(recvRate, 1),
		"latency at 10,000 changes/s p50/p99", p50.Round(time.Millisecond).String(), p99.Round(time.Millisecond).String())
}

func waitMessages(t *testing.T, src *running, n uint64, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for src.status.Get().Messages < n {
		if st := src.status.Get(); st.Phase == connector.PhaseError || time.Now().After(deadline) {
			t.Fatalf("%d of %d messages (phase %s %s)", st.Messages, n, st.Phase, st.Message)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// latency writes 10,000 rows/s for 5 s (100 per 10 ms transaction) while a
// long-polling consumer reads them, and compares each event's commit time
// with its arrival.
func latency(t *testing.T, url string, b *broker.Broker, from int) (p50, p99 time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Start the consumer at the end of the queue.
	if _, err := b.Pop(ctx, broker.PopRequest{Tenant: "default", Queue: "b", Group: "lat", Batch: 1, SubscriptionMode: "new"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		c, err := pgxConnect(url)
		if err != nil {
			done <- err
			return
		}
		defer c.Close(context.Background())
		// The test server runs synchronous_commit off: a commit would
		// reach the WAL sender only at the WAL writer's next flush (up to
		// wal_writer_delay, 200 ms), PostgreSQL's delay, not the source's.
		// An application's commit is flushed.
		if _, err := c.Exec(context.Background(), "SET synchronous_commit = on"); err != nil {
			done <- err
			return
		}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		id := from
		for i := 0; i < 500; i++ {
			<-tick.C
			if _, err := c.Exec(context.Background(), fmt.Sprintf("INSERT INTO b SELECT g, repeat(md5(g::text), 5), 1, now() FROM generate_series(%d, %d) g", id+1, id+100)); err != nil {
				done <- err
				return
			}
			id += 100
		}
		done <- nil
	}()
	var lats []time.Duration
	for len(lats) < 50000 {
		res, err := b.Pop(ctx, broker.PopRequest{Tenant: "default", Queue: "b", Group: "lat", Batch: 10000, Partitions: 10000, AutoAck: true, Wait: true, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if len(res.Messages) == 0 {
			break
		}
		for _, m := range res.Messages {
			var ev struct {
				TS time.Time `json:"ts"`
			}
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatal(err)
			}
			lats = append(lats, now.Sub(ev.TS))
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(lats) == 0 {
		t.Fatal("no events measured")
	}
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	return lats[len(lats)/2], lats[len(lats)*99/100]
}

func pgxConnect(url string) (*pgx.Conn, error) { return pgx.Connect(context.Background(), url) }

// BenchmarkBundleCommit: what one bundle costs the broker, without
// PostgreSQL: a transaction of 1,000 event messages, each opening a new
// partition with a transaction id (the source's case), all into one
// partition, or into new partitions without ids.
func BenchmarkBundleCommit(b *testing.B) {
	payload := []byte(`{"op":"c","table":"public.b","key":{"id":1},"after":{"id":1,"name":"c4ca4238a0b923820dcc509a6f75849bc4ca4238a0b923820dcc509a6f75849bc4ca4238a0b923820dcc509a6f75849b","n":1},"before":null,"lsn":"0/1","xid":1,"ts":"2026-10-03T06:15:03.000000Z","seq":0}`)
	for _, mode := range []string{"new-partitions-with-ids", "one-partition-with-ids", "new-partitions-no-ids"} {
		b.Run(mode, func(b *testing.B) {
			br, err := broker.Open(broker.Config{Cluster: cluster.Config{DataDir: b.TempDir(), RaftAddr: testkit.FreeAddr(b)}})
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			if err := br.WaitReady(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				items := make([]broker.PushItem, 1000)
				for j := range items {
					n := i*1000 + j
					items[j] = broker.PushItem{Queue: "q", Partition: strconv.Itoa(n), Payload: payload, TxID: fmt.Sprintf("pg:00000001:%016X:%d", i, j)}
					if mode == "one-partition-with-ids" {
						items[j].Partition = "x"
					}
					if mode == "new-partitions-no-ids" {
						items[j].TxID = ""
					}
				}
				if _, err := br.Transaction(context.Background(), broker.TxnRequest{Tenant: "default", Internal: true, Ops: []broker.TxnOp{{Type: broker.OpPush, Items: items}}}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
