package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// producer sends batches of messages to one queue/stream.
type producer interface {
	// send sends n messages as one batch and returns once all of them are acknowledged.
	send(ctx context.Context, n int) error
	close()
}

// consumer pops and acknowledges messages of one consumer group.
type consumer interface {
	// cycle pops up to one batch, acknowledges it and returns how many messages it
	// got (0: nothing available right now) and how many of them were redeliveries.
	cycle(ctx context.Context) (n, redelivered int, err error)
	close()
}

// firstErr keeps the first error reported by any goroutine.
type firstErr struct {
	once sync.Once
	err  error
}

func (f *firstErr) set(err error) {
	if err != nil {
		f.once.Do(func() { f.err = err })
	}
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func makeProducers(n int, newProd func(i int) (producer, error)) ([]producer, error) {
	prods := make([]producer, 0, n)
	for i := range n {
		p, err := newProd(i)
		if err != nil {
			for _, p := range prods {
				p.close()
			}
			return nil, fmt.Errorf("producer %d: %w", i, err)
		}
		prods = append(prods, p)
	}
	return prods, nil
}

// runPush runs `clients` closed-loop producers, each sending batches of
// `batch` messages back to back. Only batches acknowledged inside the measured
// window count. The window starts after the warm-up and lasts push-duration;
// when fewer than 2 batches per producer were acknowledged by then (a slow
// fsync-bound system), it is extended until they are, up to 5 × push-duration.
func runPush(ctx context.Context, cfg *config, m *cpuMeter, clients, batch int, newProd func(i int) (producer, error)) result {
	prods, err := makeProducers(clients, newProd)
	if err != nil {
		return result{err: err}
	}
	defer func() {
		for _, p := range prods {
			p.close()
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type sample struct {
		end time.Time
		lat time.Duration
	}
	t0 := time.Now()
	tw := t0.Add(cfg.warmup)
	te := tw.Add(cfg.pushDur)
	maxEnd := tw.Add(5 * cfg.pushDur)
	minBatches := int64(2 * len(prods))
	var (
		stop      atomic.Bool
		inWindow  atomic.Int64
		windowEnd time.Time // written by the timer goroutine before stop is set
		extended  bool      // likewise
		mu        sync.Mutex
		all       [][]sample
		fe        firstErr
		wg        sync.WaitGroup
	)
	for _, p := range prods {
		wg.Go(func() {
			samples := make([]sample, 0, 4096)
			defer func() {
				mu.Lock()
				all = append(all, samples)
				mu.Unlock()
			}()
			for ctx.Err() == nil && !stop.Load() {
				s := time.Now()
				if err := p.send(ctx, batch); err != nil {
					if ctx.Err() == nil {
						fe.set(err)
					}
					cancel()
					return
				}
				e := time.Now()
				if !e.Before(tw) {
					samples = append(samples, sample{end: e, lat: e.Sub(s)})
					inWindow.Add(1)
				}
			}
		})
	}
	wg.Go(func() {
		defer stop.Store(true)
		if !sleepUntil(ctx, tw) {
			return
		}
		m.begin()
		if !sleepUntil(ctx, te) {
			return
		}
		for inWindow.Load() < minBatches && time.Now().Before(maxEnd) {
			extended = true
			if !sleepUntil(ctx, time.Now().Add(5*time.Millisecond)) {
				return
			}
		}
		mu.Lock()
		windowEnd = time.Now()
		mu.Unlock()
		m.end()
	})
	wg.Wait()
	if fe.err != nil {
		return result{err: fe.err}
	}
	if err := ctx.Err(); err != nil {
		return result{err: err}
	}
	var lat []time.Duration
	for _, ss := range all {
		for _, x := range ss {
			if !x.end.After(windowEnd) {
				lat = append(lat, x.lat)
			}
		}
	}
	slices.Sort(lat)
	elapsed := windowEnd.Sub(tw)
	r := result{msgs: int64(len(lat) * batch), elapsed: elapsed, lat: lat}
	switch {
	case len(lat) == 0:
		r.note = "no batch was acknowledged inside the measured window; raise -push-duration"
	case extended:
		r.detail = fmt.Sprintf("window extended to %s to see %d batches", elapsed.Round(10*time.Millisecond), len(lat))
	}
	if cfg.pushWindow > 0 && len(lat) > 0 {
		var ends []time.Time
		for _, ss := range all {
			for _, x := range ss {
				if !x.end.After(windowEnd) {
					ends = append(ends, x.end)
				}
			}
		}
		w := windowRates(ends, tw, windowEnd, cfg.pushWindow, batch)
		if r.detail != "" {
			r.detail += "; "
		}
		r.detail += w.String()
	}
	return r
}

// windows is the rate in consecutive windows of a push run, so that a long
// run shows whether it slows down.
type windows struct {
	width time.Duration
	rates []float64 // msgs/s in each full window
	whole float64   // msgs/s over the whole run
}

// windowRates counts the batches acknowledged at each end time into windows
// of width from start; a last window shorter than half the width is left out
// of the per-window list (it still counts in the whole).
func windowRates(ends []time.Time, start, end time.Time, width time.Duration, batch int) windows {
	w := windows{width: width}
	total := end.Sub(start)
	if width <= 0 || total <= 0 {
		return w
	}
	n := int(total / width)
	if rest := total - time.Duration(n)*width; rest >= width/2 {
		n++
	}
	counts := make([]int, max(n, 1))
	for _, e := range ends {
		i := int(e.Sub(start) / width)
		if i >= 0 && i < len(counts) {
			counts[i]++
		}
	}
	for i, c := range counts {
		d := width
		if rest := total - time.Duration(i)*width; rest < width {
			d = rest
		}
		w.rates = append(w.rates, float64(c*batch)/d.Seconds())
	}
	w.whole = float64(len(ends)*batch) / total.Seconds()
	return w
}

// ratio is the whole run's rate over the first window's (1: no slow-down).
func (w windows) ratio() float64 {
	if len(w.rates) == 0 || w.rates[0] == 0 {
		return 0
	}
	return w.whole / w.rates[0]
}

func (w windows) String() string {
	parts := make([]string, len(w.rates))
	for i, r := range w.rates {
		parts[i] = fmtRate(r)
	}
	return fmt.Sprintf("msgs/s per %s: %s; whole run %s = %.2f× the first %s", w.width, strings.Join(parts, " "), fmtRate(w.whole), w.ratio(), w.width)
}

// runFill pushes exactly total messages in batches of batch with fillProducers producers.
func runFill(ctx context.Context, cfg *config, total, batch int, newProd func(i int) (producer, error)) error {
	prods, err := makeProducers(fillProducers, newProd)
	if err != nil {
		return err
	}
	defer func() {
		for _, p := range prods {
			p.close()
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next atomic.Int64
		fe   firstErr
		wg   sync.WaitGroup
	)
	for _, p := range prods {
		wg.Go(func() {
			for ctx.Err() == nil {
				end := next.Add(int64(batch))
				start := end - int64(batch)
				if start >= int64(total) {
					return
				}
				n := int(min(end, int64(total)) - start)
				if err := p.send(ctx, n); err != nil {
					if ctx.Err() == nil {
						fe.set(err)
					}
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	if fe.err != nil {
		return fe.err
	}
	return ctx.Err()
}

// runConsume drains a pre-filled queue: for every group, perGroup consumers
// loop pop+ack until the group has received target messages. The window runs
// from the first pop to the moment the last group is done.
func runConsume(ctx context.Context, cfg *config, m *cpuMeter, groups []string, perGroup int, target int64,
	newCons func(group string, i int) (consumer, error)) result {
	type member struct {
		c     consumer
		count *atomic.Int64
	}
	var members []member
	defer func() {
		for _, mb := range members {
			mb.c.close()
		}
	}()
	counts := make([]atomic.Int64, len(groups))
	for gi, g := range groups {
		for i := range perGroup {
			c, err := newCons(g, i)
			if err != nil {
				return result{err: fmt.Errorf("consumer %d of group %s: %w", i, g, err)}
			}
			members = append(members, member{c: c, count: &counts[gi]})
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.consumeTimeout)
	defer cancel()
	var (
		rec   latRecorder
		fe    firstErr
		wg    sync.WaitGroup
		empty atomic.Int64
		redel atomic.Int64
	)
	m.begin()
	t0 := time.Now()
	for _, mb := range members {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 4096)
			defer func() { rec.add(lat) }()
			for mb.count.Load() < target {
				s := time.Now()
				n, rd, err := mb.c.cycle(ctx)
				if err != nil {
					if ctx.Err() == nil {
						fe.set(err)
					} else {
						fe.set(fmt.Errorf("timed out after %s: %w", cfg.consumeTimeout, ctx.Err()))
					}
					cancel()
					return
				}
				if n == 0 {
					empty.Add(1)
					if !sleepUntil(ctx, time.Now().Add(2*time.Millisecond)) {
						fe.set(fmt.Errorf("timed out after %s with %d of %d messages delivered to one group", cfg.consumeTimeout, mb.count.Load(), target))
						return
					}
					continue
				}
				lat = append(lat, time.Since(s))
				// Count every message received: a message whose earlier
				// delivery never reached the bench comes back as a redelivery.
				mb.count.Add(int64(n))
				redel.Add(int64(rd))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	m.end()
	if fe.err != nil {
		return result{err: fe.err}
	}
	var total int64
	var note string
	for gi, g := range groups {
		c := counts[gi].Load()
		total += c
		if c != target {
			note += fmt.Sprintf("group %s received %d messages for %d stored; ", g, c, target)
		}
	}
	if rd := redel.Load(); rd > 0 {
		note += fmt.Sprintf("%d redelivered messages (a pop/fetch reply was lost or a lease/AckWait expired), so the drain time includes a redelivery wait", rd)
	}
	if e := empty.Load(); e > 0 {
		slog.Debug("empty pops", "count", e)
	}
	return result{msgs: total, elapsed: elapsed, lat: rec.sorted(), note: note}
}

// latency payloads carry the send time: {"t":<unix nanos>,"s":"........"}.
func appendLatencyPayload(dst []byte, t time.Time) []byte {
	dst = append(dst, `{"t":`...)
	dst = strconv.AppendInt(dst, t.UnixNano(), 10)
	return append(dst, `,"s":"latency-probe"}`...)
}

var tKey = []byte(`"t":`)

func parseSendTime(payload []byte) (int64, error) {
	i := bytes.Index(payload, tKey)
	if i < 0 {
		return 0, fmt.Errorf("no send time in payload %.80q", payload)
	}
	j := i + len(tKey)
	for j < len(payload) && payload[j] == ' ' {
		j++
	}
	k := j
	for k < len(payload) && payload[k] >= '0' && payload[k] <= '9' {
		k++
	}
	v, err := strconv.ParseInt(string(payload[j:k]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad send time in payload %.80q: %w", payload, err)
	}
	return v, nil
}

// runLatency paces single-message sends at cfg.latRate per second (open loop:
// a slow acknowledgement does not delay the next send) while a receiver
// started with startRecv reports every delivered payload to onMsg.
func runLatency(ctx context.Context, cfg *config, m *cpuMeter,
	startRecv func(ctx context.Context, onMsg func(payload []byte)) (wait func() error, err error),
	send func(ctx context.Context, payload []byte) error) result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	interval := time.Second / time.Duration(cfg.latRate)
	total := int((cfg.warmup + cfg.latDur) / interval)
	var (
		mu        sync.Mutex
		lat       = make([]time.Duration, 0, total)
		ackLat    = make([]time.Duration, 0, total)
		lastSend  time.Time
		received  int
		measured  int64
		tw        atomic.Int64 // unix nanos of the end of the warm-up
		parseErr  error
		done      = make(chan struct{})
		closeDone sync.Once
	)
	tw.Store(1<<63 - 1)
	onMsg := func(payload []byte) {
		now := time.Now().UnixNano()
		st, err := parseSendTime(payload)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if parseErr == nil {
				parseErr = err
			}
			return
		}
		received++
		if st >= tw.Load() {
			lat = append(lat, time.Duration(now-st))
			measured++
		}
		if received >= total {
			closeDone.Do(func() { close(done) })
		}
	}
	wait, err := startRecv(ctx, onMsg)
	if err != nil {
		return result{err: fmt.Errorf("start receiver: %w", err)}
	}
	// Give a long-poll or pull request time to reach the server.
	sleepUntil(ctx, time.Now().Add(100*time.Millisecond))

	var (
		fe  firstErr
		wg  sync.WaitGroup
		sem = make(chan struct{}, 64)
	)
	t0 := time.Now()
	twT := t0.Add(cfg.warmup)
	tw.Store(twT.UnixNano())
	wg.Go(func() {
		if sleepUntil(ctx, twT) {
			m.begin()
			if sleepUntil(ctx, twT.Add(cfg.latDur)) {
				m.end()
			}
		}
	})
	for k := range total {
		if !sleepUntil(ctx, t0.Add(time.Duration(k)*interval)) {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			st := time.Now()
			buf := appendLatencyPayload(make([]byte, 0, 64), st)
			if err := send(ctx, buf); err != nil {
				if ctx.Err() == nil {
					fe.set(err)
					cancel()
				}
				return
			}
			if !st.Before(twT) {
				d := time.Since(st)
				mu.Lock()
				ackLat = append(ackLat, d)
				if st.After(lastSend) {
					lastSend = st
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var note string
	if fe.err == nil && ctx.Err() == nil {
		tm := time.NewTimer(10 * time.Second)
		select {
		case <-done:
		case <-tm.C:
		case <-ctx.Done():
		}
		tm.Stop()
	}
	cancel()
	recvErr := wait()
	mu.Lock()
	defer mu.Unlock()
	switch {
	case fe.err != nil:
		return result{err: fmt.Errorf("send: %w", fe.err)}
	case parseErr != nil:
		return result{err: parseErr}
	case recvErr != nil && !errors.Is(recvErr, context.Canceled):
		return result{err: fmt.Errorf("receive: %w", recvErr)}
	}
	if received < total {
		note = fmt.Sprintf("%d of %d messages not received within 10 s", total-received, total)
	} else if received > total {
		note = fmt.Sprintf("%d messages received for %d sent", received, total)
	}
	slices.Sort(lat)
	slices.Sort(ackLat)
	detail := fmt.Sprintf("the push itself (send to ack): p50 %s, p99 %s; end to end max %s",
		fmtDur(percentile(ackLat, 50)), fmtDur(percentile(ackLat, 99)), fmtDur(percentile(lat, 100)))
	// A loaded machine can delay the sends: the rate is over the time they took.
	elapsed := max(cfg.latDur, lastSend.Sub(twT))
	return result{msgs: measured, elapsed: elapsed, lat: lat, note: note, detail: detail}
}

// fanGroupNames are the fan-out scenario's groups (durables), named after
// its client count so that each run reads the whole pre-filled queue.
func fanGroupNames(cfg *config, sc scenario) []string {
	groups := make([]string, cfg.fanGroups)
	for i := range groups {
		groups[i] = fmt.Sprintf("fan%d-c%d", i, sc.clients)
	}
	return groups
}

// fanPerGroup spreads the fan-out scenario's clients over its groups, at
// least one each.
func fanPerGroup(cfg *config, sc scenario) int { return max(1, sc.clients/cfg.fanGroups) }
