package pgsink

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/pgtest"
)

// benchRow is the i-th row as a message of about 200 bytes.
func benchRow(i int) string {
	return fmt.Sprintf(`{"id":%d,"customer":"customer-%06d","amount":"%d.%02d","status":"new","region":"eu-west","note":"%s"}`,
		i, i%100000, i%10000, i%100, pad[:90])
}

const benchTable = `(id bigint %s, customer text, amount numeric(12,2), status text, region text, note text)`

// BenchmarkSink measures the sink's rows/s in append and upsert mode (1 and
// 4 workers, batch 500) against PostgreSQL's own COPY of the same rows, and
// the push-to-row latency at 5,000 messages/s. It prints a table; run it
// with `make bench-sink`. PostgreSQL runs with fsync and synchronous_commit
// on, as a production server would.
func BenchmarkSink(b *testing.B) {
	const n = 100000
	pg := pgtest.Private(b, pgtest.Options{Settings: map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "shared_buffers": "256MB"}})
	db := pg.URL(pg.NewDatabase(b))
	ctx := context.Background()
	rows := make([]string, n)
	for i := range rows {
		rows[i] = benchRow(i)
	}
	// COPY: the same rows as COPY text, one statement, into a table like
	// the sink's (no key for append, a primary key for upsert).
	var sb strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&sb, "%d\tcustomer-%06d\t%d.%02d\tnew\teu-west\t%s\n", i, i%100000, i%10000, i%100, pad[:90])
	}
	copyText := sb.String()
	copyRate := func(key string) float64 {
		exec(b, db, "DROP TABLE IF EXISTS copied", fmt.Sprintf("CREATE TABLE copied "+benchTable, key))
		conn, err := pgx.Connect(ctx, db)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		start := time.Now()
		if _, err := conn.PgConn().CopyFrom(ctx, strings.NewReader(copyText), "COPY copied FROM STDIN"); err != nil {
			b.Fatal(err)
		}
		return n / time.Since(start).Seconds()
	}
	copyPS := map[string]float64{
		"append": max(copyRate(""), copyRate("")),
		"upsert": max(copyRate("PRIMARY KEY"), copyRate("PRIMARY KEY")),
	}
	out := io.Writer(os.Stdout)
	fmt.Fprintf(out, "\nsink throughput, %d messages of ~%d bytes, batch 500, 16 partitions\n", n, len(rows[0]))
	fmt.Fprintf(out, "COPY of the same rows: %.0f rows/s (no key), %.0f rows/s (primary key)\n", copyPS["append"], copyPS["upsert"])
	fmt.Fprintf(out, "%-8s %-8s %12s %10s\n", "mode", "workers", "rows/s", "vs COPY")
	for _, mode := range benchModes() {
		for _, workers := range benchWorkers() {
			bk := openBroker(b)
			queue := fmt.Sprintf("%s%d", mode, workers)
			table := "t_" + queue
			key := ""
			if mode == "upsert" {
				key = "PRIMARY KEY"
			}
			exec(b, db, fmt.Sprintf("CREATE TABLE "+table+" "+benchTable, key))
			pushRows(b, bk, queue, rows, 16)
			spec := sinkSpec(queue, "public."+table, mode)
			spec.Batch, spec.Workers = 500, workers
			start := time.Now()
			r := startSink(b, bk, queue, db, spec)
			waitFor(b, "all rows", 10*time.Minute, func() error {
				if r.metrics.applied.get() < n {
					return fmt.Errorf("applied %v", r.metrics.applied.get())
				}
				return nil
			})
			rate := n / time.Since(start).Seconds()
			r.stop()
			if c := count(b, db, "SELECT count(*) FROM "+table); c != n {
				b.Fatalf("%s: %d rows, want %d", table, c, n)
			}
			fmt.Fprintf(out, "%-8s %-8d %12.0f %9.2fx\n", mode, workers, rate, rate/copyPS[mode])
			bk.Close()
		}
	}
	// The broker's own share: the same pops and acks with no PostgreSQL.
	{
		bk := openBroker(b)
		pushRows(b, bk, "popack", rows, 16)
		start := time.Now()
		got := 0
		for got < n {
			resp, err := bk.Pop(ctx, broker.PopRequest{Tenant: "default", Queue: "popack", Group: "g", Batch: 500, Partitions: 500, SubscriptionMode: "all", LeaseSeconds: 60})
			if err != nil {
				b.Fatal(err)
			}
			items := make([]broker.AckItem, len(resp.Messages))
			for i, m := range resp.Messages {
				off := m.Offset
				items[i] = broker.AckItem{PartitionID: m.PartitionID, Offset: &off, Group: "g", LeaseID: resp.LeaseID}
			}
			if len(items) > 0 {
				if _, err := bk.Ack(ctx, "default", items); err != nil {
					b.Fatal(err)
				}
			}
			got += len(items)
		}
		fmt.Fprintf(out, "%-17s %12.0f   (the broker's pop+ack of batches of 500, no PostgreSQL)\n", "pop+ack only", float64(n)/time.Since(start).Seconds())
		bk.Close()
	}
	// Latency: push at 5,000 messages/s for 10 s; each row's arrival time
	// (clock_timestamp() at insert) minus the push time in the message.
	bk := openBroker(b)
	exec(b, db, `CREATE TABLE lat (id bigint, pushed_at timestamptz, arrived timestamptz DEFAULT clock_timestamp())`)
	spec := sinkSpec("lat", "public.lat", "append")
	r := startSink(b, bk, "lat", db, spec)
	const rate, secs, tick = 5000, 10, 10 * time.Millisecond
	per := rate * int(tick) / int(time.Second)
	start := time.Now()
	sent := 0
	for sent < rate*secs {
		due := int(time.Since(start) * rate / time.Second)
		var items []broker.PushItem
		for ; sent < due && sent < rate*secs; sent++ {
			items = append(items, broker.PushItem{Queue: "lat", Partition: fmt.Sprintf("p%d", sent%16),
				Payload: []byte(fmt.Sprintf(`{"id":%d,"pushed_at":"%s","note":"%s"}`, sent, time.Now().UTC().Format(time.RFC3339Nano), pad[:120]))})
		}
		if len(items) > 0 {
			if _, err := bk.Push(ctx, "default", items); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(tick)
	}
	_ = per
	waitFor(b, "latency rows", 2*time.Minute, func() error {
		if r.metrics.applied.get() < rate*secs {
			return fmt.Errorf("applied %v", r.metrics.applied.get())
		}
		return nil
	})
	pct := query(b, db, `SELECT round(1000 * extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY arrived - pushed_at))::numeric, 1),
		round(1000 * extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY arrived - pushed_at))::numeric, 1) FROM lat`)
	fmt.Fprintf(out, "\npush->row latency at %d messages/s for %d s (append, 1 worker, 16 partitions): p50 | p99 ms = %s\n", rate, secs, pct[0])
}

// pushRows pushes rows into queue over parts partitions.
func pushRows(b testing.TB, bk *broker.Broker, queue string, rows []string, parts int) {
	var items []broker.PushItem
	for i, r := range rows {
		items = append(items, broker.PushItem{Queue: queue, Partition: fmt.Sprintf("p%d", i%parts), Payload: []byte(r)})
		if len(items) == 1000 || i == len(rows)-1 {
			if _, err := bk.Push(context.Background(), "default", items); err != nil {
				b.Fatal(err)
			}
			items = items[:0]
		}
	}
}

// benchModes and benchWorkers narrow the run (QUEEN_BENCH_MODES=append,
// QUEEN_BENCH_WORKERS=1) when profiling one case.
func benchModes() []string {
	if v := os.Getenv("QUEEN_BENCH_MODES"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"append", "upsert"}
}

func benchWorkers() []int {
	if v := os.Getenv("QUEEN_BENCH_WORKERS"); v != "" {
		var out []int
		for _, s := range strings.Split(v, ",") {
			var n int
			fmt.Sscan(s, &n)
			out = append(out, n)
		}
		return out
	}
	return []int{1, 4}
}
