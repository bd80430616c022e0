package pgsource

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/connector"
)

// TestStreamWaits: the replication stream's read deadline is moved only
// when a wait must end sooner, so each wait must still hold exactly: a
// short wait after a long one returns empty on time, a long wait after a
// short one that left its (now past) deadline set still gets a change
// that arrives later, and the end of the context ends a wait at once.
func TestStreamWaits(t *testing.T) {
	s, db := ordersSource(t)
	s.Exec(t, db, "CREATE PUBLICATION waits FOR TABLE orders")
	s.Exec(t, db, "SELECT pg_create_logical_replication_slot('waits', 'pgoutput')")
	ctx := context.Background()
	doc := sourceDoc(s, db, "waits")
	conn, err := dialReplication(ctx, connector.Env{Doc: doc, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	st, err := startStream(ctx, conn, "waits", "waits", 0)
	if err != nil {
		t.Fatal(err)
	}
	insert := func(id int) {
		s.Exec(t, db, "INSERT INTO orders (id, customer, status, total, created_at) VALUES ($1, '{}', 'new', 1, now())", id)
	}
	// readTxn reads one transaction's begin, insert and commit.
	readTxn := func(wait time.Duration) {
		t.Helper()
		for _, want := range []byte{'B', 'I', 'C'} {
			for {
				data, _, err := st.next(ctx, wait)
				if err != nil {
					t.Fatal(err)
				}
				if data == nil {
					t.Fatalf("no %c message within %v", want, wait)
				}
				if data[0] == 'R' {
					continue
				}
				if data[0] != want {
					t.Fatalf("message %c, want %c", data[0], want)
				}
				break
			}
		}
	}

	// A long wait that got its data, then a short one.
	insert(10)
	readTxn(8 * time.Second)
	start := time.Now()
	if data, _, err := st.next(ctx, 200*time.Millisecond); err != nil || data != nil {
		t.Fatalf("a quiet stream gave %q, %v", data, err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 2*time.Second {
		t.Fatalf("a wait of 200ms took %v", d)
	}

	// A short wait that got its data leaves a deadline that passes; a
	// long wait after it still receives a change made later.
	insert(11)
	readTxn(3 * time.Second)
	time.Sleep(400 * time.Millisecond) // the short wait's deadline passes
	go func() {
		time.Sleep(300 * time.Millisecond)
		insert(12)
	}()
	readTxn(8 * time.Second)

	// The end of the context ends a long wait.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, cancel)
	start = time.Now()
	if _, _, err := st.next(cctx, 8*time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait ended with %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("a cancelled wait took %v", d)
	}
}
