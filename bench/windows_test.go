package main

import (
	"bufio"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// A push that slows down shows it: the per-window rates fall and the whole
// run's rate is below the first window's.
func TestWindowRates(t *testing.T) {
	start := time.Unix(1000, 0)
	var ends []time.Time
	// 100 batches in the first 10 s, 50 in each of the next two.
	for i := range 100 {
		ends = append(ends, start.Add(time.Duration(i)*100*time.Millisecond))
	}
	for i := range 100 {
		ends = append(ends, start.Add(10*time.Second+time.Duration(i)*200*time.Millisecond))
	}
	w := windowRates(ends, start, start.Add(30*time.Second), 10*time.Second, 100)
	want := []float64{1000, 500, 500}
	if len(w.rates) != len(want) {
		t.Fatalf("rates %v; want %v", w.rates, want)
	}
	for i := range want {
		if math.Abs(w.rates[i]-want[i]) > 1e-9 {
			t.Errorf("window %d: %.1f msgs/s; want %.1f", i, w.rates[i], want[i])
		}
	}
	if r := w.ratio(); math.Abs(r-2.0/3) > 1e-9 {
		t.Errorf("ratio %.3f; want 0.667", r)
	}
	if s := w.String(); !strings.Contains(s, "0.67× the first 10s") {
		t.Errorf("report %q does not give the ratio", s)
	}
	// A short last window (under half a window) is left out of the list.
	w = windowRates(ends, start, start.Add(24*time.Second), 10*time.Second, 100)
	if len(w.rates) != 2 {
		t.Errorf("24 s in 10 s windows: %d windows; want 2", len(w.rates))
	}
}

func TestParseProcStatus(t *testing.T) {
	in := "Name:\tqueen\nVmHWM:\t  120000 kB\nVmRSS:\t  100000 kB\nThreads:\t12\n"
	m, err := parseProcStatus(bufio.NewScanner(strings.NewReader(in)))
	if err != nil || m.rss != 100000<<10 || m.hwm != 120000<<10 {
		t.Fatalf("%+v, %v; want rss 100000 kB, hwm 120000 kB", m, err)
	}
	if _, err := parseProcStatus(bufio.NewScanner(strings.NewReader("Name:\tqueen\n"))); err == nil {
		t.Error("a status without VmRSS parsed")
	}
	// This process's own figures parse, and a write shows in its counters.
	if _, err := readProcMemory(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	w0, _, err := procIO(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "io")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<16)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if w1, _, err := procIO(os.Getpid()); err != nil || w1-w0 < 1<<16 {
		t.Errorf("wchar moved by %d after a 64 KiB write (%v)", w1-w0, err)
	}
}
