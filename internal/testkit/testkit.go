// Package testkit holds helpers shared by the test suites: free loopback
// addresses, polling until a condition holds, small disks to fill (Tmpfs),
// and running the real queen binary (BuildQueen once per test binary, then
// a Queen process per node: start, SIGTERM, kill -9, restart on the same
// data, its log, /health). It is imported only by tests.
package testkit

import (
	"net"
	"sync"
	"testing"
	"time"
)

var (
	portsMu   sync.Mutex
	portsUsed = map[string]bool{}
)

// FreeAddrs returns n loopback addresses with free ports, each handed out
// once per test binary, so parallel tests never receive the same port twice.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	var out []string
	var hold []net.Listener
	defer func() {
		for _, l := range hold {
			l.Close()
		}
	}()
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		hold = append(hold, l)
		if a := l.Addr().String(); !portsUsed[a] {
			portsUsed[a] = true
			out = append(out, a)
		}
	}
	return out
}

// FreeAddr returns one free loopback address.
func FreeAddr(t testing.TB) string { return FreeAddrs(t, 1)[0] }

// CheckFor calls f every interval until it returns nil or total passes (like
// nats-server's checkFor) and returns f's last error.
func CheckFor(total, interval time.Duration, f func() error) error {
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(interval)
	}
}
