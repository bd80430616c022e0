package pgsink

import (
	"fmt"
	"slices"
	"testing"
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
	prog := query(t, db, `SELECT sink, partition, last_offset FROM queen.sink_progress`)
	if !slices.Equal(prog, []string{"invoices-sink | 7 | 1"}) {
		t.Fatalf("progress %q", prog)
	}
}
