package pgsink

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/broker"
)

// slowProxy forwards connections to a PostgreSQL server, holding every
// message of the server's for delay before passing it on, and counts, per
// connection, the requests the client sent (simple queries and Syncs, each
// answered by one ReadyForQuery) beyond the ReadyForQuery messages it had
// been given: a client that waits for each answer never has more than one
// request unanswered, one that pipelines has more.
type slowProxy struct {
	ln          net.Listener
	target      string
	delay       time.Duration
	unanswered  atomic.Int64 // the most seen on one connection
	wg          sync.WaitGroup
	mu          sync.Mutex
	conns       []net.Conn
	closed      bool
	requests    atomic.Int64
	readyForQry atomic.Int64
}

func newSlowProxy(t *testing.T, dbURL string, delay time.Duration) (*slowProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{ln: ln, target: u.Host, delay: delay}
	u.Host = ln.Addr().String()
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p, u.String()
}

func (p *slowProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *slowProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, cs...)
	return !p.closed
}

func (p *slowProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, s) {
			c.Close()
			s.Close()
			return
		}
		var sent, answered atomic.Int64
		p.wg.Add(2)
		go func() { // client to server, at once
			defer p.wg.Done()
			defer s.Close()
			// the startup message has no type byte
			var n [4]byte
			if _, err := io.ReadFull(c, n[:]); err != nil {
				return
			}
			body := make([]byte, binary.BigEndian.Uint32(n[:])-4)
			if _, err := io.ReadFull(c, body); err != nil {
				return
			}
			if _, err := s.Write(append(n[:], body...)); err != nil {
				return
			}
			sent.Add(1) // the startup is answered by a ReadyForQuery too
			p.messages(c, func(typ byte, msg []byte) bool {
				if typ == 'Q' || typ == 'S' {
					p.requests.Add(1)
					if u := sent.Add(1) - answered.Load(); u > p.unanswered.Load() {
						p.unanswered.Store(u) // one writer per connection; the max of all is what is read
					}
				}
				_, err := s.Write(msg)
				return err == nil
			})
		}()
		go func() { // server to client, each message held for delay
			defer p.wg.Done()
			defer c.Close()
			type held struct {
				at  time.Time
				typ byte
				msg []byte
			}
			ch := make(chan held, 1<<16)
			go func() {
				defer close(ch)
				p.messages(s, func(typ byte, msg []byte) bool {
					ch <- held{time.Now(), typ, msg}
					return true
				})
			}()
			for h := range ch {
				time.Sleep(time.Until(h.at.Add(p.delay)))
				if h.typ == 'Z' {
					// counted before the client can see it, and so answer
					p.readyForQry.Add(1)
					answered.Add(1)
				}
				if _, err := c.Write(h.msg); err != nil {
					s.Close()
					for range ch {
					}
					return
				}
			}
		}()
	}
}

// messages reads typed protocol messages from r until f says stop or r
// ends.
func (p *slowProxy) messages(r io.Reader, f func(typ byte, msg []byte) bool) {
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		msg := make([]byte, 1+n)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(r, msg[5:]); err != nil {
			return
		}
		if !f(hdr[0], msg) {
			return
		}
	}
}

// TestPipelinedBatchesSentBeforeAnswer: with the server's answers held
// back 20 ms, a worker that has its next batch and the offsets of its
// partitions writes that batch's transaction before the answer to the one
// before arrives (two requests unanswered on its connection), and every
// message is in the table once. A worker pipelines only when its next pop
// is back by the time it has written a batch, which on a loaded machine a
// run of 64 batches can miss throughout; so a run that shows no pipelining
// is tried again, up to three runs, each checked for exactly once.
func TestPipelinedBatchesSentBeforeAnswer(t *testing.T) {
	for _, mode := range []string{"append", "upsert"} {
		t.Run(mode, func(t *testing.T) {
			// Groups close on their count (maxPending), not on the age of
			// their first batch: with answers 20 ms late, and later still
			// on a loaded machine, a 25 ms age would close every group
			// after a batch or two, and a closed group is answered before
			// the next batch is written.
			defer func(d time.Duration) { maxPendingAge = d }(maxPendingAge)
			maxPendingAge = time.Minute
			for run := 1; ; run++ {
				unanswered, pipelined := pipelinedRun(t, mode)
				if unanswered >= 2 && pipelined > 0 {
					return
				}
				if run == 3 {
					t.Fatalf("in %d runs at most %d request unanswered on a connection and %d batches written behind another: the sink waited for each answer", run, unanswered, pipelined)
				}
				t.Logf("run %d: no batch written behind another; trying again", run)
			}
		})
	}
}

// pipelinedRun sinks 4,000 messages of 16 partitions in batches of 50
// through a proxy that holds answers back 20 ms, checks that the table
// holds each once, and returns the most requests unanswered on one
// connection and the batches written behind another. Sixteen partitions:
// a batch's partition stays leased until its group's barrier, so with a
// few partitions the pop loop would often find nothing to pop ahead.
func pipelinedRun(t *testing.T, mode string) (unanswered int64, pipelined int64) {
	t.Helper()
	db := newDB(t)
	createNums(t, db, mode)
	proxy, viaProxy := newSlowProxy(t, db, 20*time.Millisecond)
	b := openBroker(t)
	const n = 4000
	pushNumbered(t, b, "nums", 16, 0, n)
	spec := sinkSpec("nums", "public.nums", mode)
	spec.Batch = 50
	r := startSink(t, b, "nums", viaProxy, spec)
	waitFor(t, "all acked", 60*time.Second, func() error {
		if a := r.metrics.applied.get(); a != n {
			return fmt.Errorf("applied %v", a)
		}
		return nil
	})
	r.stop()
	if got := query(t, db, `SELECT count(*), count(DISTINCT n), min(n), max(n) FROM nums`); got[0] != fmt.Sprintf("%d | %d | 0 | %d", n, n, n-1) {
		t.Fatalf("rows: %s", got[0])
	}
	t.Logf("requests %d, answers %d, most unanswered on one connection %d; batches pipelined %d, one trip %d, redone %d, awaited %d",
		proxy.requests.Load(), proxy.readyForQry.Load(), proxy.unanswered.Load(), r.sink.pipelined.Load(), r.sink.oneTrip.Load(), r.sink.redone.Load(), r.sink.awaited.Load())
	return int64(proxy.unanswered.Load()), r.sink.pipelined.Load()
}

// TestPipelineFailureRedone: two batches written back to back on one
// connection, the first of which fails: another node moved the first
// batch's partition (its check fails), or the first batch holds a value
// the table refuses (its COPY fails), or a row that breaks a deferred
// constraint (its COMMIT fails). In each case the second one commits on
// its own (each batch is a transaction of its own; it would fail its
// check if it shared the first one's partition), before the first is done
// again, and the pending batches stay in commit order. The table ends with every
// row once: the moved partition's rows the other node wrote are skipped,
// the refused message is refused with PostgreSQL's error and the rows of
// its partition after it are left for later.
func TestPipelineFailureRedone(t *testing.T) {
	for _, tc := range []string{"moved", "refused", "commit"} {
		t.Run(tc, func(t *testing.T) {
			ctx := context.Background()
			db := newDB(t)
			exec(t, db, `CREATE TABLE nums (n int, pad text, CONSTRAINT nums_n UNIQUE (n) DEFERRABLE INITIALLY DEFERRED)`)
			env, _ := envFor(nil, "pipe", connFor(db), sinkSpec("x", "public.nums", "append"))
			env.Broker = &broker.Broker{}
			rn, err := New(env)
			if err != nil {
				t.Fatal(err)
			}
			sk := rn.(*sink)
			conn, p, err := sk.connect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			w := &worker{s: sk, conn: conn, plan: p, stmts: map[string]string{}}
			// partition pid's messages from..to-1, row n = 1000*pid + offset
			badData := `{"n":"not a number","pad":"x"}`
			if tc == "commit" {
				badData = `{"n":1003,"pad":"x"}` // partition 1's offset 3 again
			}
			batch := func(pid, from, to int, bad int) (*broker.PopResponse, *decodedBatch) {
				var msgs []broker.Delivery
				for off := from; off < to; off++ {
					data := fmt.Sprintf(`{"n":%d,"pad":"x"}`, 1000*pid+off)
					if off == bad {
						data = badData
					}
					msgs = append(msgs, broker.Delivery{Partition: fmt.Sprintf("p%d", pid), PartitionID: uint64(pid), Offset: uint64(off), Payload: []byte(data), Attempt: 1})
				}
				items, parts := w.group(msgs)
				if err := w.decode(ctx, items, parts); err != nil {
					t.Fatal(err)
				}
				return &broker.PopResponse{Delivered: msgs, LeaseID: fmt.Sprintf("l%d-%d", pid, from)}, &decodedBatch{items: items, parts: parts, ok: true}
			}
			// The first batch of each partition sets the connection up and
			// learns the offsets, on its own.
			for pid := 1; pid <= 2; pid++ {
				resp, pre := batch(pid, 0, 10, -1)
				if err := w.batchSync(ctx, resp, pre, nil); err != nil {
					t.Fatal(err)
				}
			}
			bad := -1
			switch tc {
			case "moved":
				// another node wrote partition 1's offsets 10..14
				exec(t, db, `INSERT INTO nums SELECT 1000 + g, 'x' FROM generate_series(10, 14) g`,
					`UPDATE queen.sink_progress SET last_offset = 14 WHERE sink = 'pipe' AND partition_id = 1`)
			case "refused", "commit":
				bad = 15
			}
			w.ahead = &broker.PopResponse{} // a next batch is ready: no barrier rows
			r1, pre1 := batch(1, 10, 20, bad)
			r2, pre2 := batch(2, 10, 20, -1)
			if !w.send(ctx, r1, pre1, nil) || !w.send(ctx, r2, pre2, nil) {
				t.Fatal("a batch with known offsets was not pipelined")
			}
			if len(w.flights) != 2 || sk.pipelined.Load() != 1 {
				t.Fatalf("%d flights, %d pipelined", len(w.flights), sk.pipelined.Load())
			}
			if err := w.drain(ctx); err != nil {
				t.Fatal(err)
			}
			// Each batch is its own implicit transaction: the second one
			// commits on its own partition whatever the first did, and the
			// first is done again after it.
			wantRedone, first := int64(1), 3 // the first batch's place among the pending
			if got := sk.redone.Load(); got != wantRedone {
				t.Fatalf("%d batches done again, want %d", got, wantRedone)
			}
			if len(w.pending) != 4 || w.pending[first].resp != r1 || w.pending[5-first].resp != r2 {
				t.Fatalf("%d batches pending, want 4, the first batch at %d", len(w.pending), first)
			}
			want := []string{}
			for pid := 1; pid <= 2; pid++ {
				for off := 0; off < 20; off++ {
					if pid == 1 && bad >= 0 && off >= bad {
						continue
					}
					want = append(want, fmt.Sprint(1000*pid+off))
				}
			}
			slices.Sort(want)
			got := query(t, db, `SELECT n::text FROM nums ORDER BY 1`)
			if !slices.Equal(got, want) {
				t.Fatalf("rows %v\nwant %v", got, want)
			}
			res1 := w.pending[first].res
			switch tc {
			case "moved":
				if sk.moved.Load() != 1 || res1.skipped != 5 || res1.applied != 5 {
					t.Fatalf("moved %d; first batch skipped %d applied %d, want 5 and 5", sk.moved.Load(), res1.skipped, res1.applied)
				}
			case "refused", "commit":
				var states []int
				for _, it := range pre1.parts[0].items {
					states = append(states, it.state)
				}
				if !slices.Equal(states, []int{stApplied, stApplied, stApplied, stApplied, stApplied, stRefused, stLater, stLater, stLater, stLater}) {
					t.Fatalf("states %v", states)
				}
				want := map[string]string{"refused": "invalid input syntax for type integer", "commit": `duplicate key value violates unique constraint "nums_n"`}[tc]
				if e := pre1.parts[0].items[5].errText; !strings.Contains(e, want) {
					t.Fatalf("refused with %q", e)
				}
			}
			if got := query(t, db, `SELECT partition_id, last_offset FROM queen.sink_progress WHERE sink = 'pipe' ORDER BY 1`); !slices.Equal(got, []string{fmt.Sprintf("1 | %d", map[bool]int{true: 14, false: 19}[bad >= 0]), "2 | 19"}) {
				t.Fatalf("progress %v", got)
			}
		})
	}
}

// TestAnswerTimeEstimate: the estimate of a connection's answer time
// follows answers read after waiting, is never raised by one that was in
// before it was read (a wait that ran to its end must not lengthen the
// next), falls when such an answer was in by the estimate, and starts
// over on another connection.
func TestAnswerTimeEstimate(t *testing.T) {
	c1, c2 := &pgconn.PgConn{}, &pgconn.PgConn{}
	var a answerTime
	if _, ok := a.due(c1, time.Now()); ok {
		t.Fatal("an estimate before any answer")
	}
	a.note(c1, 8*time.Millisecond, false)
	if _, ok := a.due(c1, time.Now()); ok {
		t.Fatal("an answer read without waiting gave a first estimate")
	}
	a.note(c1, 8*time.Millisecond, true)
	if a.d != 8*time.Millisecond {
		t.Fatalf("first estimate %v, want 8ms", a.d)
	}
	a.note(c1, 16*time.Millisecond, true)
	if a.d != 10*time.Millisecond {
		t.Fatalf("after a later answer %v, want 10ms", a.d)
	}
	for range 5 {
		a.note(c1, 30*time.Millisecond, false)
	}
	if a.d >= 10*time.Millisecond {
		t.Fatalf("answers in before they were read raised or kept the estimate: %v", a.d)
	}
	before := a.d
	a.note(c1, 2*time.Millisecond, false)
	if a.d >= before {
		t.Fatalf("an answer in after 2ms did not lower %v", before)
	}
	at := time.Now()
	if until, ok := a.due(c1, at); !ok || until != at.Add(a.d) {
		t.Fatalf("due %v %v", until, ok)
	}
	if _, ok := a.due(c2, at); ok {
		t.Fatal("an estimate for another connection")
	}
	a.note(c2, 4*time.Millisecond, true)
	if a.d != 4*time.Millisecond {
		t.Fatalf("a new connection's estimate %v, want 4ms", a.d)
	}
}
