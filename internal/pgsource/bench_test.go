package pgsource

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/budget"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/testkit"
)

// TestBenchSource measures the source against PostgreSQL's own limits on
// this machine (make bench-source): snapshot rows/s against COPY of the
// same table, streaming changes/s against pg_recvlogical reading the same
// WAL with pgoutput, and commit-to-consumer latency at 10,000 changes/s.
// It runs only with QUEEN_BENCH_SOURCE=1; QUEEN_BENCH_BUNDLE_MESSAGES
// replaces the default maxBundleMessages, QUEEN_BENCH_FSYNC the broker's
// raft log durability ("always", "interval"), QUEEN_BENCH_CHUNK_ROWS the
// snapshotChunkRows; QUEEN_BENCH_SNAPSHOT_CPUPROFILE
// writes a CPU profile of the snapshot phase, and QUEEN_BENCH_SNAPSHOT_ONLY
// ends the run after it; QUEEN_BENCH_PIPELINE_DEPTH replaces how many
// bundles' transactions may be in flight at once.
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

	b := openBrokerFsync(t, os.Getenv("QUEEN_BENCH_FSYNC"))
	defer b.Close()
	// QUEEN_BENCH_PARTITION_BY=single: every row into one partition (the
	// default is a partition per row, named after its key).
	ts := connector.TableSpec{Table: "public.b", Queue: "b"}
	if v := os.Getenv("QUEEN_BENCH_PARTITION_BY"); v != "" {
		ts.PartitionBy = json.RawMessage(strconv.Quote(v))
	}
	doc := sourceDoc(s, db, "bench", ts)
	if n, err := strconv.Atoi(os.Getenv("QUEEN_BENCH_BUNDLE_MESSAGES")); err == nil && n > 0 {
		doc.Source.MaxBundleMessages = n
	}
	if n, err := strconv.Atoi(os.Getenv("QUEEN_BENCH_CHUNK_ROWS")); err == nil && n > 0 {
		doc.Source.SnapshotChunkRows = n
	}
	start = time.Now()
	tl := &timeline{}
	tl.begin()
	snap := startPhaseCPU(t, os.Getenv("QUEEN_BENCH_SNAPSHOT_CPUPROFILE"))
	h := tl.hooks()
	if n, err := strconv.Atoi(os.Getenv("QUEEN_BENCH_PIPELINE_DEPTH")); err == nil && n > 0 {
		h.depth = n
	}
	src := startSource(t, b, doc, "n1", h)
	waitMessages(t, src, uint64(rows), 10*time.Minute)
	snapRate := float64(rows) / time.Since(start).Seconds()
	snap.stop(t, "snapshot", rows)
	backendCPU(t, c, "snapshot", rows)
	tl.report(t, "snapshot")
	if os.Getenv("QUEEN_BENCH_SNAPSHOT_ONLY") != "" {
		t.Logf("snapshot rows/s %.0f, COPY %.0f, ratio %.2f", snapRate, copyRate, snapRate/copyRate)
		return
	}

	// Streaming: a second slot reads the same WAL with pg_recvlogical.
	s.Exec(t, db, "SELECT pg_create_logical_replication_slot('bench_recv', 'pgoutput')")
	// The writer commits as an application does (the test server runs
	// synchronous_commit off: its commit would reach the WAL senders only
	// at the WAL writer's next flush, up to wal_writer_delay later).
	if _, err := c.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	prof := startStreamProfile(t, c, "queen_bench")
	tl.begin()
	start = time.Now()
	if _, err := c.Exec(ctx, fmt.Sprintf(fill, rows+1, 2*rows)); err != nil {
		t.Fatal(err)
	}
	inserted := time.Since(start)
	waitMessages(t, src, uint64(2*rows), 10*time.Minute)
	streamTime := time.Since(start)
	streamRate := float64(rows) / streamTime.Seconds()
	prof.stop(t, rows, inserted, streamTime)
	tl.report(t, "streaming")
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
	// pg_recvlogical reads WAL that is all written; the source's figure
	// above includes the writer's transaction, which PostgreSQL sends
	// only once it commits (streaming off). From the commit on, both
	// wait for the same decoding.
	fromCommit := float64(rows) / (streamTime - inserted).Seconds()
	t.Logf("\n%-34s %12s %12s %7s\n%-34s %12.0f %12.0f %7.2f\n%-34s %12.0f %12.0f %7.2f\n%-34s %12.0f %12.0f %7.2f\n%-34s %12s %12s\n",
		"rows of ~200 bytes", "queen", "postgres", "ratio",
		fmt.Sprintf("snapshot rows/s (vs COPY), %d", rows), snapRate, copyRate, snapRate/copyRate,
		"streaming changes/s (vs pg_recvlogical)", streamRate, recvRate, streamRate/max(recvRate, 1),
		"  the same from the writer's commit", fromCommit, recvRate, fromCommit/max(recvRate, 1),
		"latency at 10,000 changes/s p50/p99", p50.Round(time.Millisecond).String(), p99.Round(time.Millisecond).String())
}

// openBrokerFsync opens the benchmark's broker with the raft log
// durability mode ("" is always).
func openBrokerFsync(t *testing.T, mode string) *broker.Broker {
	t.Helper()
	m, err := cluster.ParseFsyncMode(mode)
	if err != nil {
		t.Fatal(err)
	}
	// The memory budget the binary gives a node by default, as a user
	// runs it.
	mem := budget.For(budget.Default)
	cfg := cluster.Config{DataDir: t.TempDir(), RaftAddr: testkit.FreeAddr(t), Fsync: m,
		CacheBytes: mem.CacheBytes, MemTableBytes: mem.MemTableBytes, DedupBytes: int(mem.DedupBytes)}
	b, err := broker.Open(broker.Config{Cluster: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WaitReady(context.Background()); err != nil {
		b.Close()
		t.Fatal(err)
	}
	return b
}

// streamProfile measures the streaming phase alone: the CPU the test
// process and the source's WAL sender used (per 100,000 changes, which
// the machine's load moves less than the rates), and, with
// QUEEN_BENCH_CPUPROFILE / QUEEN_BENCH_MEMPROFILE set to a file, a CPU
// profile of that phase and allocation profiles at its start (file.base)
// and end.
type streamProfile struct {
	ru      syscall.Rusage
	walPid  int
	walTick int64
	cpuFile *os.File
	memFrom pprofAlloc
}

type pprofAlloc struct{ bytes, objects int64 }

func startStreamProfile(t *testing.T, c *pgx.Conn, slot string) *streamProfile {
	t.Helper()
	p := &streamProfile{}
	if err := c.QueryRow(context.Background(), "SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&p.walPid); err != nil {
		t.Fatal(err)
	}
	p.walTick = procTicks(p.walPid)
	if path := os.Getenv("QUEEN_BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		p.cpuFile = f
	}
	if path := os.Getenv("QUEEN_BENCH_MEMPROFILE"); path != "" {
		writeAllocs(t, path+".base")
	}
	p.memFrom = allocated()
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &p.ru); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *streamProfile) stop(t *testing.T, rows int, inserted, total time.Duration) {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano() - p.ru.Utime.Nano() - p.ru.Stime.Nano())
	wal := time.Duration(procTicks(p.walPid)-p.walTick) * 10 * time.Millisecond
	mem := allocated()
	if p.cpuFile != nil {
		pprof.StopCPUProfile()
		_ = p.cpuFile.Close()
	}
	if path := os.Getenv("QUEEN_BENCH_MEMPROFILE"); path != "" {
		writeAllocs(t, path)
	}
	per := float64(100000) / float64(rows)
	t.Logf("streaming %d changes: insert %v, all in the broker after %v; per 100k changes: test process CPU %.2fs, walsender CPU %.2fs, allocated %.0f MB in %.0fk objects",
		rows, inserted.Round(time.Millisecond), total.Round(time.Millisecond), cpu.Seconds()*per, wal.Seconds()*per,
		float64(mem.bytes-p.memFrom.bytes)*per/1e6, float64(mem.objects-p.memFrom.objects)*per/1e3)
}

// phaseCPU is the test process's CPU over one phase, and, given a file,
// a CPU profile of it.
type phaseCPU struct {
	ru   syscall.Rusage
	file *os.File
}

func startPhaseCPU(t *testing.T, path string) *phaseCPU {
	t.Helper()
	p := &phaseCPU{}
	if path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		p.file = f
	}
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &p.ru); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *phaseCPU) stop(t *testing.T, phase string, rows int) {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	if p.file != nil {
		pprof.StopCPUProfile()
		_ = p.file.Close()
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano() - p.ru.Utime.Nano() - p.ru.Stime.Nano())
	t.Logf("%s %d rows: test process CPU %.2fs per 100k rows, %d minor page faults per 100k rows", phase, rows, cpu.Seconds()*100000/float64(rows), (ru.Minflt-p.ru.Minflt)*100000/int64(rows))
}

// backendCPU logs the CPU of the source's PostgreSQL backends (its query
// connection and its WAL sender) over their lives so far, per 100,000
// rows: they start with the source, so after the snapshot it is the
// snapshot's.
func backendCPU(t *testing.T, c *pgx.Conn, phase string, rows int) {
	t.Helper()
	r, err := c.Query(context.Background(), `SELECT pid, backend_type FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		t.Fatal(err)
	}
	ticks := map[string]int64{}
	for r.Next() {
		var pid int
		var typ string
		if err := r.Scan(&pid, &typ); err != nil {
			t.Fatal(err)
		}
		ticks[typ] += procTicks(pid)
	}
	r.Close()
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	per := func(n int64) float64 { return float64(n) / 100 * 100000 / float64(rows) }
	t.Logf("%s %d rows: PostgreSQL CPU per 100k rows: query backend %.2fs, WAL sender %.2fs", phase, rows, per(ticks["client backend"]), per(ticks["walsender"]))
}

// writeAllocs writes the allocation profile so far (the phase's is its
// difference to the one written at its start: pprof -diff_base).
func writeAllocs(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}

func allocated() pprofAlloc {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return pprofAlloc{int64(m.TotalAlloc), int64(m.Mallocs)}
}

// procTicks is the user and system CPU of process pid in clock ticks
// (0 when it cannot be read).
func procTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if pid == 0 || err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

// timeline records, while on, the bundles the reader hands over, the
// committer's broker transactions and the snapshot's chunk reads (from
// the low watermark to the high one written): how a phase's wall time
// splits between them.
type timeline struct {
	mu      sync.Mutex
	on      bool
	from    time.Time
	handed  []time.Time
	sizes   []int
	commits []time.Duration // each bundle's broker transaction
	starts  []time.Time     // of the transactions in flight, in order
	open    time.Time       // since when one has been in flight
	busy    time.Duration   // time with at least one in flight
	first   time.Time       // first bundle handed
	last    time.Time       // last commit done
	chunkAt time.Time       // the chunk being read: its low watermark's start
	chunks  []time.Duration
}

func (tl *timeline) begin() {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.on, tl.from = true, time.Now()
	tl.handed, tl.sizes, tl.commits, tl.chunks, tl.busy = nil, nil, nil, nil, 0
	tl.first, tl.last = time.Time{}, time.Time{}
}

func (tl *timeline) hooks() *hooks {
	return &hooks{
		handed: func(msgs int, _ *pointer) {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			if tl.on && msgs > 0 { // not a pointer-only bundle (a heartbeat's)
				now := time.Now()
				if tl.first.IsZero() {
					tl.first = now
				}
				tl.handed, tl.sizes = append(tl.handed, now), append(tl.sizes, msgs)
			}
		},
		beforeCommit: func(msgs int, _ *pointer) error {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			if msgs > 0 {
				now := time.Now()
				if len(tl.starts) == 0 {
					tl.open = now
				}
				tl.starts = append(tl.starts, now)
			}
			return nil
		},
		beforeLow: func(string) {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			tl.chunkAt = time.Now()
		},
		afterHigh: func(string, pglogrepl.LSN) {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			if tl.on {
				tl.chunks = append(tl.chunks, time.Since(tl.chunkAt))
			}
		},
		afterCommit: func(msgs int, _ *pointer) error {
			tl.mu.Lock()
			defer tl.mu.Unlock()
			if msgs == 0 || len(tl.starts) == 0 {
				return nil
			}
			now := time.Now()
			started := tl.starts[0]
			tl.starts = tl.starts[1:]
			if tl.on {
				tl.last = now
				tl.commits = append(tl.commits, now.Sub(started))
				if len(tl.starts) == 0 {
					tl.busy += now.Sub(tl.open)
				}
			}
			if len(tl.starts) > 0 {
				// The next in flight: its share of the busy time from now.
				if tl.on {
					tl.busy += now.Sub(tl.open)
				}
				tl.open = now
			}
			return nil
		},
	}
}

func (tl *timeline) report(t *testing.T, phase string) {
	t.Helper()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.on = false
	if len(tl.handed) == 0 {
		return
	}
	var each time.Duration
	for _, d := range tl.commits {
		each += d
	}
	busy := tl.busy
	msgs := 0
	for _, n := range tl.sizes {
		msgs += n
	}
	span := tl.last.Sub(tl.first)
	t.Logf("%s timeline: first bundle handed %v after the phase started; %d bundles (%.0f messages each) over %v; the committer in broker transactions %v (%.0f%%), %v per bundle; each transaction %v from proposal to answer",
		phase, tl.first.Sub(tl.from).Round(time.Millisecond), len(tl.handed), float64(msgs)/float64(len(tl.handed)), span.Round(time.Millisecond),
		busy.Round(time.Millisecond), 100*busy.Seconds()/span.Seconds(), (busy / time.Duration(max(len(tl.commits), 1))).Round(10*time.Microsecond),
		(each / time.Duration(max(len(tl.commits), 1))).Round(10*time.Microsecond))
	if len(tl.chunks) > 0 {
		var read time.Duration
		for _, d := range tl.chunks {
			read += d
		}
		t.Logf("%s timeline: %d chunks read (low watermark to high) in %v (%.0f%% of the phase), %v per chunk",
			phase, len(tl.chunks), read.Round(time.Millisecond), 100*read.Seconds()/tl.last.Sub(tl.from).Seconds(),
			(read / time.Duration(len(tl.chunks))).Round(10*time.Microsecond))
	}
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
