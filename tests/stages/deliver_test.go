package stages

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/stagetime"
)

// delivery is one message as the latency scenario's client saw it.
type delivery struct {
	sent, recv time.Time
	pop        string // the delivering pop's first message id
	batch      int    // the consumer's batch (reply) number, from 0
}

// ackSent is one acknowledgement of a batch as the consumer's client saw
// it (QUEEN_STAGES_ACK=explicit): the batch received, the ack sent (after
// the acks before it were answered) and answered.
type ackSent struct {
	recv, sent, replied time.Time
	batch               int
}

// The latency scenario's consumers (QUEEN_STAGES_ACK).
const (
	ackExplicit  = "explicit"  // lease, then ack each batch after receipt, in order on a connection of its own (the bench's -latency-ack explicit)
	ackPipelined = "pipelined" // lease, then ack each batch at once without waiting for the acks before it to be answered
	ackNone      = "none"      // autoAck pops
)

// ackMode is QUEEN_STAGES_ACK: explicit (the default, as the bench's
// -latency-ack), pipelined or none.
func ackMode(t testing.TB) string {
	switch v := os.Getenv("QUEEN_STAGES_ACK"); v {
	case "", ackExplicit:
		return ackExplicit
	case ackPipelined, ackNone:
		return v
	default:
		t.Fatalf("QUEEN_STAGES_ACK=%q: want explicit, pipelined or none", v)
		return ""
	}
}

// runDeliver pushes one message every gap for d (open loop, one request per
// message) while one consumer long-polls, as the bench's latency scenario
// does, and returns every delivery. Under ackExplicit the consumer leases
// and acknowledges each batch after receipt on a connection of its own, in
// order, while its next pop already waits (the bench's -latency-ack
// explicit); under ackPipelined each ack goes at once, beside the ones not
// yet answered; under ackNone it pops with autoAck.
func runDeliver(s *server, queue string, d, gap time.Duration, mode string) ([]delivery, []time.Duration, []ackSent, error) {
	explicit := mode != ackNone
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	total := int(d / gap)
	// QUEEN_STAGES_PARTITIONS spreads the pushes over that many partitions
	// (the bench's scenario has one): a message then need not wait for
	// the previous batch's lease on its partition.
	parts := envInts("QUEEN_STAGES_PARTITIONS", []int{1})[0]
	var (
		mu      sync.Mutex
		out     []delivery
		acks    []time.Duration
		ackLog  []ackSent
		batches int
		done    = make(chan struct{})
		errc    = make(chan error, 1)
	)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	path := "/api/v1/pop/queue/" + queue + "?batch=100&wait=true&timeout=30000"
	if !explicit {
		path += "&autoAck=true"
	}
	type ackJob struct {
		body  []byte
		n     int
		recv  time.Time
		batch int
	}
	ackq := make(chan ackJob, 1024)
	ackDone := make(chan struct{})
	sendAck := func(j ackJob) {
		st := time.Now()
		reply, _, err := s.do(context.Background(), http.MethodPost, "/api/v1/ack/batch", j.body, http.StatusOK)
		if err == nil && bytes.Count(reply, []byte(`"success":true`)) != j.n {
			err = fmt.Errorf("ack of %d messages: %.300s", j.n, reply)
		}
		if err != nil {
			report(err)
			return
		}
		mu.Lock()
		ackLog = append(ackLog, ackSent{recv: j.recv, sent: st, replied: time.Now(), batch: j.batch})
		mu.Unlock()
	}
	if explicit {
		go func() {
			defer close(ackDone)
			var inflight sync.WaitGroup
			defer inflight.Wait()
			for j := range ackq {
				if mode == ackPipelined {
					inflight.Go(func() { sendAck(j) })
					continue
				}
				sendAck(j)
			}
		}()
	} else {
		close(ackDone)
	}
	var polls sync.WaitGroup
	for range envInts("QUEEN_STAGES_POLLS", []int{1})[0] {
		polls.Go(func() {
			for ctx.Err() == nil {
				body, st, err := s.do(ctx, http.MethodGet, path, nil, http.StatusOK, http.StatusNoContent)
				if err != nil {
					if ctx.Err() == nil {
						report(err)
					}
					return
				}
				now := time.Now()
				if st == http.StatusNoContent {
					continue
				}
				var rep struct {
					LeaseID  string `json:"leaseId"`
					Messages []struct {
						ID            string `json:"id"`
						TransactionID string `json:"transactionId"`
						PartitionID   string `json:"partitionId"`
						LeaseID       string `json:"leaseId"`
						Data          struct {
							T int64 `json:"t"`
						} `json:"data"`
					} `json:"messages"`
				}
				if err := json.Unmarshal(body, &rep); err != nil {
					report(fmt.Errorf("pop reply %.200s: %w", body, err))
					return
				}
				if len(rep.Messages) == 0 {
					continue
				}
				mu.Lock()
				batch := batches
				batches++
				for _, m := range rep.Messages {
					out = append(out, delivery{sent: time.Unix(0, m.Data.T), recv: now, pop: rep.Messages[0].ID, batch: batch})
					if len(out) == total {
						close(done)
					}
				}
				mu.Unlock()
				if explicit {
					ack := []byte(`{"acknowledgments":[`)
					for i, m := range rep.Messages {
						if i > 0 {
							ack = append(ack, ',')
						}
						lease := m.LeaseID
						if lease == "" {
							lease = rep.LeaseID
						}
						ack = fmt.Appendf(ack, `{"transactionId":%q,"partitionId":%q,"leaseId":%q,"status":"completed"}`, m.TransactionID, m.PartitionID, lease)
					}
					ack = append(ack, "]}"...)
					ackq <- ackJob{body: ack, n: len(rep.Messages), recv: now, batch: batch}
				}
			}
		})
	}
	// Let the long poll reach the server.
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	var wg sync.WaitGroup
	for k := range total {
		time.Sleep(time.Until(t0.Add(time.Duration(k) * gap)))
		wg.Go(func() {
			st := time.Now()
			body := fmt.Appendf(nil, `{"items":[{"queue":%q,"partition":"p%d","payload":{"t":%d}}]}`, queue, k%parts, st.UnixNano())
			if _, _, err := s.do(ctx, http.MethodPost, "/api/v1/push", body, http.StatusCreated); err != nil {
				if ctx.Err() == nil {
					report(err)
				}
				return
			}
			mu.Lock()
			acks = append(acks, time.Since(st))
			mu.Unlock()
		})
	}
	wg.Wait()
	var err error
	select {
	case <-done:
	case err = <-errc:
	case <-time.After(20 * time.Second):
		mu.Lock()
		err = fmt.Errorf("%d of %d messages delivered after 20 s", len(out), total)
		mu.Unlock()
	}
	// The consumer stops, then its last acks are answered.
	cancel()
	polls.Wait()
	close(ackq)
	<-ackDone
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	if err != nil {
		return nil, nil, nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(out), slices.Clone(acks), slices.Clone(ackLog), nil
}

// deliverStage is one span of a delivery, from the client's send to its
// receipt, through the delivering pop's stamps.
type deliverStage struct {
	name string
	at   func(dv delivery, t *stagetime.Trace, e *stagetime.EntryView) int64 // its end, on the stamps' clock; 0: unknown
}

var deliverStages = []deliverStage{
	{"send → pop request arrives (when after the send)", func(_ delivery, t *stagetime.Trace, _ *stagetime.EntryView) int64 { return t.At[stagetime.Start].Wall }},
	{"pop request → first proposal (when after the send)", func(_ delivery, t *stagetime.Trace, _ *stagetime.EntryView) int64 {
		if t.At[stagetime.Woken].Set() {
			return 0
		}
		return t.At[stagetime.Queued].Wall
	}},
	{"send → pop woken (push over HTTP, its path to the wake)", func(_ delivery, t *stagetime.Trace, _ *stagetime.EntryView) int64 { return t.At[stagetime.Woken].Wall }},
	{"woken → pop queued for the log", func(_ delivery, t *stagetime.Trace, _ *stagetime.EntryView) int64 { return t.At[stagetime.Queued].Wall }},
	{"queued → proposed (ready loop takes it)", func(_ delivery, t *stagetime.Trace, _ *stagetime.EntryView) int64 {
		return t.At[stagetime.Proposed].Wall
	}},
	{"proposed → log write starts", func(_ delivery, _ *stagetime.Trace, e *stagetime.EntryView) int64 {
		return e.At[stagetime.StoreStart].Wall
	}},
	{"log write (+ fsync)", func(_ delivery, _ *stagetime.Trace, e *stagetime.EntryView) int64 {
		return e.At[stagetime.StoreEnd].Wall
	}},
	{"write → apply starts", func(_ delivery, _ *stagetime.Trace, e *stagetime.EntryView) int64 {
		return e.At[stagetime.ApplyStart].Wall
	}},
	{"apply", func(_ delivery, _ *stagetime.Trace, e *stagetime.EntryView) int64 {
		return e.At[stagetime.ApplyEnd].Wall
	}},
	{"apply → handler has result", func(_ delivery, t *stagetime.Trace, _ *stagetime.EntryView) int64 { return t.At[stagetime.Result].Wall }},
	{"reply written", func(_ delivery, t *stagetime.Trace, _ *stagetime.EntryView) int64 {
		return t.At[stagetime.Written].Wall
	}},
	{"written → client has it", func(dv delivery, _ *stagetime.Trace, _ *stagetime.EntryView) int64 { return stagetime.Wall(dv.recv) }},
}

// deliverRow is one delivery cut into spans.
type deliverRow struct {
	total  time.Duration
	spans  []time.Duration // by deliverStages; -1: not on this delivery's path
	dv     delivery
	polled bool // the pop arrived after the send (no wake needed)
}

// BenchmarkDeliverStages attributes the push→consumer latency of the
// bench's latency scenario (1,000 one-message pushes a second, one
// consumer long-polling as QUEEN_STAGES_ACK says, real HTTP over
// loopback) to the
// delivering pop's stages, for all deliveries and for the slowest 1%, and
// prints the slowest deliveries stage by stage. QUEEN_STAGES_FSYNC picks
// the fsync policy, QUEEN_STAGES_SECONDS the measured time.
func BenchmarkDeliverStages(b *testing.B) {
	secs := envInts("QUEEN_STAGES_SECONDS", []int{4})[0]
	mode := ackMode(b)
	s := startServer(b, 1)
	// Warm up: the queue, the connections.
	if _, _, _, err := runDeliver(s, "lat", 300*time.Millisecond, time.Millisecond, mode); err != nil {
		b.Fatal(err)
	}
	col := &collector{}
	la := loadAvg()
	stagetime.Enable(col.add)
	dvs, acks, ackLog, err := runDeliver(s, "lat", time.Duration(secs)*time.Second, time.Millisecond, mode)
	stagetime.Disable()
	if err != nil {
		b.Fatal(err)
	}
	pops := map[string]*stagetime.Trace{}
	var ackTraces, pushTraces []*stagetime.Trace
	col.mu.Lock()
	for _, t := range col.traces {
		switch {
		case t.Kind == "pop" && t.Tag != "":
			pops[t.Tag] = t
		case t.Kind == "ack":
			ackTraces = append(ackTraces, t)
		case t.Kind == "push":
			pushTraces = append(pushTraces, t)
		}
	}
	col.mu.Unlock()
	type row = deliverRow
	var rows []row
	missing, woken, shared := 0, 0, 0
	for _, dv := range dvs {
		t := pops[dv.pop]
		if t == nil || t.Entry == nil {
			missing++
			continue
		}
		e := t.Entry.View()
		if t.At[stagetime.Woken].Set() {
			woken++
			if e.Cmds > 1 {
				shared++
			}
		}
		r := row{total: dv.recv.Sub(dv.sent), dv: dv, spans: make([]time.Duration, len(deliverStages))}
		prev := stagetime.Wall(dv.sent)
		if t.At[stagetime.Start].Wall > prev {
			// The consumer's poll arrived after the send: the push met no
			// waiting pop.
			r.polled = true
		}
		for i, st := range deliverStages {
			end := st.at(dv, t, &e)
			if end == 0 || end < prev {
				r.spans[i] = -1
				continue
			}
			r.spans[i] = time.Duration(end - prev)
			prev = end
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		b.Fatalf("no delivery matched a pop's stamps (%d deliveries)", len(dvs))
	}
	slices.SortFunc(rows, func(a, b row) int { return int(a.total - b.total) })
	w := os.Stdout
	polled := 0
	for _, r := range rows {
		if r.polled {
			polled++
		}
	}
	fmt.Fprintf(w, "\n### Push→consumer stages (%s, %d s, QUEEN_FSYNC=%s, consumer ack %s, %d partition(s), load %s; %d deliveries, %d unmatched, %d met no waiting pop; µs)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), secs, fsyncMode(b), mode, envInts("QUEEN_STAGES_PARTITIONS", []int{1})[0], la, len(rows), missing, polled)
	p50, p99 := fsyncProbe(b)
	fmt.Fprintf(w, "fsync probe (4 KiB write + fdatasync, 200 times, before the run's end): p50 %s, p99 %s\n", us(p50), us(p99))
	totals := make([]time.Duration, len(rows))
	for i, r := range rows {
		totals[i] = r.total
	}
	fmt.Fprintf(w, "woken pops whose entry held more than their own command (the push's, when it joined it): %d of %d\n", shared, woken)
	fmt.Fprintf(w, "end to end: p50 %s, p99 %s, max %s; the push itself (send to ack): p50 %s, p99 %s\n\n", us(pct(totals, 0.5)), us(pct(totals, 0.99)), us(pct(totals, 1)),
		us(pct(acks, 0.5)), us(pct(acks, 0.99)))
	tail := rows[len(rows)-max(1, len(rows)/100):]
	fmt.Fprintln(w, "| stage | p50 | p99 | mean | mean in the slowest 1% | on path (all / slowest) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for i, st := range deliverStages {
		var all, slow []time.Duration
		for _, r := range rows {
			if r.spans[i] >= 0 {
				all = append(all, r.spans[i])
			}
		}
		for _, r := range tail {
			if r.spans[i] >= 0 {
				slow = append(slow, r.spans[i])
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d / %d |\n", st.name, us(pct(all, 0.5)), us(pct(all, 0.99)), us(mean(all)), us(mean(slow)), len(all), len(slow))
	}
	pushSpans(w, pushTraces)
	if mode != ackNone && envInts("QUEEN_STAGES_PARTITIONS", []int{1})[0] == 1 {
		leaseWaits(w, rows, pops, ackLog, ackTraces)
	}
	fmt.Fprintln(w, "\nthe 10 slowest (sent at since the first, total; each stage, µs; - = not on its path):")
	first := rows[0].dv.sent
	for _, r := range rows {
		if r.dv.sent.Before(first) {
			first = r.dv.sent
		}
	}
	for _, r := range slices.Backward(rows[max(0, len(rows)-10):]) {
		line := fmt.Sprintf("  %v, %s:", r.dv.sent.Sub(first).Round(time.Millisecond), us(r.total))
		for _, sp := range r.spans {
			if sp < 0 {
				line += " -"
			} else {
				line += " " + strconv.FormatInt(sp.Microseconds(), 10)
			}
		}
		if r.polled {
			line += " (met no waiting pop)"
		}
		fmt.Fprintln(w, line)
	}
}
