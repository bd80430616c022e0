package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The memory scenario (-only memory) pushes -memory-messages small messages
// into one queue and consumes them all with pop+ack, while it samples the
// server's resident memory. It runs against a queen this program started
// (it needs the server's process id) and reports the peak (VmHWM) and the
// resident size once the queue is drained.

// procMemory is one reading of /proc/<pid>/status.
type procMemory struct {
	rss, hwm int64 // VmRSS, VmHWM in bytes
}

func readProcMemory(pid int) (procMemory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMemory{}, fmt.Errorf("read memory of pid %d: %w", pid, err)
	}
	defer f.Close()
	return parseProcStatus(bufio.NewScanner(f))
}

// parseProcStatus reads VmRSS and VmHWM (in kB) from /proc/<pid>/status.
func parseProcStatus(sc *bufio.Scanner) (procMemory, error) {
	var m procMemory
	var seen int
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("parse %s: %q", k, v)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("parse %s: %w", k, err)
		}
		if k == "VmRSS" {
			m.rss = n << 10
		} else {
			m.hwm = n << 10
		}
		seen++
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if seen != 2 {
		return m, fmt.Errorf("VmRSS or VmHWM missing")
	}
	return m, nil
}

// rssSampler records the highest VmRSS it sees (VmHWM covers the whole
// life of the process, which includes nothing before the scenario here,
// but a sampled peak per phase says which phase it was).
type rssSampler struct {
	pid  int
	mu   sync.Mutex
	peak int64
	err  error
	stop chan struct{}
	done chan struct{}
}

func startRSSSampler(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) sample() {
	m, err := readProcMemory(s.pid)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.err = err
		return
	}
	s.peak = max(s.peak, m.rss)
}

// phasePeak returns the peak since the last call and starts a new phase.
func (s *rssSampler) phasePeak() (int64, error) {
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.peak, s.err
	s.peak = 0
	return p, err
}

func (s *rssSampler) close() {
	close(s.stop)
	<-s.done
}

func fmtMiB(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// memory is the memory scenario against a queen this program started.
func (q *queenSystem) memory(ctx context.Context, sc scenario, m *cpuMeter) result {
	pid := q.serverPID()
	if pid == 0 {
		return result{err: fmt.Errorf("the memory scenario reads the server's /proc/<pid>/status: run it against a queen the bench starts (no -queen-url)")}
	}
	start, err := readProcMemory(pid)
	if err != nil {
		return result{err: err}
	}
	queue := q.queueName("memory")
	if err := q.configure(ctx, queue); err != nil {
		return result{err: q.fail(err)}
	}
	total := q.cfg.memoryMessages
	s := startRSSSampler(pid, 250*time.Millisecond)
	defer s.close()
	payload := makePayload(30)
	t0 := time.Now()
	if err := runFill(ctx, q.cfg, total, 100, func(i int) (producer, error) {
		return q.newProducer(queue, i, q.cfg.consPartitions, 100, payload, false), nil
	}); err != nil {
		return result{err: fmt.Errorf("push %d messages: %w", total, err)}
	}
	pushTook := time.Since(t0)
	pushPeak, err := s.phasePeak()
	if err != nil {
		return result{err: err}
	}
	slog.Info("memory: pushed", "messages", total, "took", pushTook.Round(time.Millisecond), "rss_peak", fmtMiB(pushPeak))
	// The consumers read with their own long timeout: at the rates of this
	// machine, draining ten million messages takes minutes.
	ccfg := *q.cfg
	ccfg.consumeTimeout = max(q.cfg.consumeTimeout, 30*time.Minute)
	r := runConsume(ctx, &ccfg, m, []string{"mem"}, sc.clients, int64(total),
		func(g string, _ int) (consumer, error) { return q.newConsumer(queue, g), nil })
	if r.err != nil {
		return r
	}
	consumePeak, err := s.phasePeak()
	if err != nil {
		return result{err: err}
	}
	end, err := readProcMemory(pid)
	if err != nil {
		return result{err: err}
	}
	r.detail = fmt.Sprintf("%d messages pushed in %s (%s msgs/s) and consumed in %s; RSS at start %s, peak while pushing %s, while consuming %s, at the end %s; VmHWM %s",
		total, pushTook.Round(time.Second), fmtRate(float64(total)/pushTook.Seconds()), r.elapsed.Round(time.Second),
		fmtMiB(start.rss), fmtMiB(pushPeak), fmtMiB(consumePeak), fmtMiB(end.rss), fmtMiB(end.hwm))
	slog.Info("memory: consumed", "detail", r.detail)
	return r
}

func (n *natsSystem) memory(context.Context, scenario, *cpuMeter) result {
	return result{note: "the memory scenario measures queen only (JetStream runs inside the bench process)"}
}
