package pgsink

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/pgtest"
)

// TestInvoicesExample: the documented invoices example gives exactly its
// table: generated columns derived, a key with no column ignored, the
// second message changing only total, the offset in a metadata column.
func TestInvoicesExample(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE invoices (
  id            bigint PRIMARY KEY,
  customer      jsonb,
  lines         jsonb,
  total         numeric(12,2),
  customer_tier text GENERATED ALWAYS AS (customer->>'tier') STORED,
  city          text GENERATED ALWAYS AS (customer->'address'->>'city') STORED,
  queen_offset  bigint
)`)
	b := openBroker(t)
	spec := sinkSpec("invoices", "public.invoices", "upsert")
	spec.Metadata = map[string]string{"offset": "queen_offset"}
	push(t, b, "invoices", "7",
		`{"id":7,"customer":{"name":"Ada","tier":"gold","address":{"city":"Turin"}},"lines":[{"sku":"A1","qty":2}],"total":"12.50","note":"no column, ignored"}`,
		`{"id":7,"total":15}`)
	r := startSink(t, b, "invoices-sink", db, spec)
	waitFor(t, "both messages applied", 30e9, func() error {
		if r.metrics.applied.get() != 2 {
			return fmt.Errorf("applied %v", r.metrics.applied.get())
		}
		return nil
	})
	got := query(t, db, `SELECT id, customer, lines, total, customer_tier, city, queen_offset FROM invoices`)
	want := []string{`7 | {"name": "Ada", "tier": "gold", "address": {"city": "Turin"}} | [{"qty": 2, "sku": "A1"}] | 15.00 | gold | Turin | 1`}
	if !slices.Equal(got, want) {
		t.Fatalf("invoices:\n got %q\nwant %q", got, want)
	}
	if st := r.status.Get(); st.Phase != "running" {
		t.Fatalf("status %+v", st)
	}
	if c := r.sink.copied.Load(); c != 2 {
		t.Fatalf("COPY wrote %d rows, want 2", c)
	}
	prog := query(t, db, `SELECT sink, partition, last_offset FROM queen.sink_progress`)
	if !slices.Equal(prog, []string{"invoices-sink | 7 | 1"}) {
		t.Fatalf("progress %q", prog)
	}
}

// TestAppendMappingRules: keys go to the column of exactly that name
// (case-sensitive), unnamed columns get their DEFAULT, values convert from
// the producer's characters (numeric text, composite, array, jsonb),
// generated columns are never written, and metadata facts land in columns.
func TestAppendMappingRules(t *testing.T) {
	db := newDB(t)
	exec(t, db,
		`CREATE TYPE addr AS (street text, zip int)`,
		`CREATE TABLE events (
  seq      bigserial,
  "Name"   text,
  name     text,
  amount   numeric(12,2),
  tags     text[],
  home     addr,
  doc      jsonb,
  status   text DEFAULT 'new',
  doubled  numeric GENERATED ALWAYS AS (amount * 2) STORED,
  m_part   text, m_pid bigint, m_off bigint, m_tx text, m_at timestamptz, m_payload jsonb
)`)
	b := openBroker(t)
	spec := sinkSpec("ev", "public.events", "append")
	spec.Metadata = map[string]string{"partition": "m_part", "partitionId": "m_pid", "offset": "m_off",
		"transactionId": "m_tx", "createdAt": "m_at", "payload": "m_payload"}
	push(t, b, "ev", "p1",
		`{"Name":"Upper","amount":"12.50","tags":["a","b"],"home":{"street":"Via Roma","zip":10100},"doc":{"z":1,"a":[1,2]},"doubled":99}`,
		`{"name":"lower","amount":3,"status":null}`,
		`[1,2,3]`)
	r := startSink(t, b, "ev", db, spec)
	waitCount(t, db, `SELECT count(*) FROM events`, 3)
	got := query(t, db, `SELECT "Name", name, amount, tags, home, doc, status, doubled, m_part, m_off, m_payload FROM events ORDER BY seq`)
	want := []string{
		`Upper | NULL | 12.50 | {a,b} | ("Via Roma",10100) | {"a": [1, 2], "z": 1} | new | 25.00 | p1 | 0 | {"doc": {"a": [1, 2], "z": 1}, "Name": "Upper", "home": {"zip": 10100, "street": "Via Roma"}, "tags": ["a", "b"], "amount": "12.50", "doubled": 99}`,
		`NULL | lower | 3.00 | NULL | NULL | NULL | NULL | 6.00 | p1 | 1 | {"name": "lower", "amount": 3, "status": null}`,
		`NULL | NULL | NULL | NULL | NULL | NULL | new | NULL | p1 | 2 | [1, 2, 3]`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rows:\n got %q\nwant %q", got, want)
	}
	meta := query(t, db, `SELECT m_pid > 0, m_tx <> '', m_at > now() - interval '1 minute' FROM events`)
	for _, row := range meta {
		if row != "t | t | t" {
			t.Fatalf("metadata partitionId/transactionId/createdAt: %q", meta)
		}
	}
	if r.metrics.batches.get() < 1 || r.metrics.applied.get() != 3 {
		t.Fatalf("metrics: batches %v applied %v", r.metrics.batches.get(), r.metrics.applied.get())
	}
	// The array and the composite go through populate; the rest by COPY.
	if c, p := r.sink.copied.Load(), r.sink.populated.Load(); c != 2 || p != 1 {
		t.Fatalf("COPY wrote %d rows and populate %d, want 2 and 1", c, p)
	}
}

// TestSinkOverVerifyFull: a sink whose connection checks the server's
// certificate against sslRootCert writes its rows, encrypted.
func TestSinkOverVerifyFull(t *testing.T) {
	pg := pgtest.Private(t, pgtest.Options{SSL: true})
	name := pg.NewDatabase(t)
	db := pg.URL(name)
	exec(t, db, `CREATE TABLE s (id int PRIMARY KEY, v text)`)
	b := openBroker(t)
	env, m := envFor(b, "tls", connector.Connection{Host: "localhost", Port: pg.Port(), Database: name, User: "postgres",
		SSLMode: "verify-full", SSLRootCert: string(pg.CACertPEM()), ConnectTimeoutMs: 10000}, sinkSpec("s", "public.s", "upsert"))
	env.Password = pgtest.Password
	r, err := New(env)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	push(t, b, "s", "1", `{"id":1,"v":"secret"}`)
	waitCount(t, db, `SELECT count(*) FROM s WHERE v = 'secret'`, 1)
	// The metric moves with the ack, just after the commit.
	waitFor(t, "applied 1", 30*time.Second, func() error {
		if m.applied.get() != 1 {
			return fmt.Errorf("applied %v", m.applied.get())
		}
		return nil
	})
	enc := query(t, db, `SELECT bool_and(ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'queen'`)
	if enc[0] != "t" {
		t.Fatalf("sink sessions encrypted: %q", enc)
	}
}

// TestSubscriptionNewAndWorkers: with subscriptionMode "new" the sink skips
// what the queue held when its group was created; each of its workers has a
// connection of its own.
func TestSubscriptionNewAndWorkers(t *testing.T) {
	db := newDB(t)
	exec(t, db, `CREATE TABLE w (v text)`)
	b := openBroker(t)
	push(t, b, "w", "p", `{"v":"old1"}`, `{"v":"old2"}`)
	spec := sinkSpec("w", "public.w", "append")
	spec.SubscriptionMode, spec.Workers = "new", 3
	r := startSink(t, b, "w", db, spec)
	waitPhase(t, r, "running", "")
	waitFor(t, "three sessions", 30*time.Second, func() error {
		if c := count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'queen' AND datname = current_database()`); c != 3 {
			return fmt.Errorf("%d sessions", c)
		}
		return nil
	})
	// The group exists once a worker popped; wait for it before pushing.
	waitFor(t, "the group created", 30*time.Second, func() error {
		gs, err := b.Groups(context.Background(), "default", "pg-w")
		if err != nil || len(gs) != 1 {
			return fmt.Errorf("groups %+v %v", gs, err)
		}
		return nil
	})
	push(t, b, "w", "p", `{"v":"new1"}`, `{"v":"new2"}`)
	waitCount(t, db, `SELECT count(*) FROM w`, 2)
	if got := query(t, db, `SELECT v FROM w ORDER BY v`); !slices.Equal(got, []string{"new1", "new2"}) {
		t.Fatalf("rows %q", got)
	}
}
