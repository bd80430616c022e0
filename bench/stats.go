package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// result is what one system measured for one scenario.
type result struct {
	msgs    int64         // messages counted in the measured window
	elapsed time.Duration // length of the measured window
	lat     []time.Duration
	err     error
	note    string // something off (lost messages, redeliveries): listed under "Errors and notes"
	detail  string // extra numbers: listed under "Details"

	clientCores float64 // CPU cores busy in the bench process during the window (-1: unknown)
	serverCores float64 // CPU cores busy in the server process during the window (-1: unknown or same process)
}

func (r *result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.msgs) / r.elapsed.Seconds()
}

// percentile returns the nearest-rank percentile of sorted latencies (0 when empty).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

func (r *result) p(q float64) time.Duration { return percentile(r.lat, q) }

// latRecorder collects latency samples from many goroutines; each goroutine
// appends to its own slice and the slices are merged once at the end.
type latRecorder struct {
	mu     sync.Mutex
	shards [][]time.Duration
}

func (l *latRecorder) add(s []time.Duration) {
	l.mu.Lock()
	l.shards = append(l.shards, s)
	l.mu.Unlock()
}

func (l *latRecorder) sorted() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.shards {
		n += len(s)
	}
	all := make([]time.Duration, 0, n)
	for _, s := range l.shards {
		all = append(all, s...)
	}
	slices.Sort(all)
	return all
}

// cpuMeter measures how many cores the bench process and, when known, the
// server process kept busy between begin and end.
type cpuMeter struct {
	serverPID int // 0: server runs inside this process or elsewhere

	mu              sync.Mutex
	t0              time.Time
	self0, srv0     time.Duration
	srvOK           bool
	clientC, serveC float64
	done            bool
}

func newCPUMeter(serverPID int) *cpuMeter {
	return &cpuMeter{serverPID: serverPID, clientC: -1, serveC: -1}
}

func (m *cpuMeter) begin() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.t0 = time.Now()
	m.self0 = selfCPU()
	m.srvOK = false
	if m.serverPID > 0 {
		if c, err := procCPU(m.serverPID); err == nil {
			m.srv0, m.srvOK = c, true
		}
	}
}

func (m *cpuMeter) end() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.t0.IsZero() || m.done {
		return
	}
	m.done = true
	wall := time.Since(m.t0).Seconds()
	if wall <= 0 {
		return
	}
	m.clientC = (selfCPU() - m.self0).Seconds() / wall
	if m.srvOK {
		if c, err := procCPU(m.serverPID); err == nil {
			m.serveC = (c - m.srv0).Seconds() / wall
		}
	}
}

func (m *cpuMeter) fill(r *result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r.clientCores, r.serverCores = m.clientC, m.serveC
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU reads utime+stime of a process from /proc/<pid>/stat (Linux, USER_HZ=100).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	// After the command name: state is field 3, utime field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

func fmtRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e4:
		return fmt.Sprintf("%.1fk", r/1e3)
	case r >= 1e3:
		return fmt.Sprintf("%.2fk", r/1e3)
	default:
		return fmt.Sprintf("%.0f", r)
	}
}

func fmtDur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0fms", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1fms", ms)
	case ms >= 1:
		return fmt.Sprintf("%.2fms", ms)
	default:
		return fmt.Sprintf("%.0fµs", ms*1000)
	}
}

func fmtCores(c float64) string {
	if c < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", c)
}

// procIO reads what a process wrote: wchar (bytes passed to write calls,
// sockets included) and write_bytes (bytes it sent to the disk), from
// /proc/<pid>/io.
func procIO(pid int) (wchar, writeBytes int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read io of pid %d: %w", pid, err)
	}
	var seen int
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, perr := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch {
		case k != "wchar" && k != "write_bytes":
			continue
		case perr != nil:
			return 0, 0, fmt.Errorf("parse /proc/%d/io %s: %w", pid, k, perr)
		case k == "wchar":
			wchar = n
		default:
			writeBytes = n
		}
		seen++
	}
	if seen != 2 {
		return 0, 0, fmt.Errorf("parse /proc/%d/io: wchar or write_bytes missing", pid)
	}
	return wchar, writeBytes, nil
}
