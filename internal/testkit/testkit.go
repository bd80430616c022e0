// Package testkit holds helpers shared by the test suites: free loopback
// addresses, polling until a condition holds, small disks to fill (Tmpfs),
// and running the real queen binary (BuildQueen once per test binary, then
// a Queen process per node: start, SIGTERM, kill -9, restart on the same
// data, its log, /health). It is imported only by tests.
package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
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
// The ports come from below the kernel's ephemeral range: a port from that
// range, free when chosen, can be taken before the server binds it by any
// outgoing connection (a node dialling its peers while another node of the
// same test has yet to listen), and the bind then fails with "address
// already in use".
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
	lo, hi := fixedPortRange()
	for tries := 0; len(out) < n; tries++ {
		addr := "127.0.0.1:0"
		if hi > lo && tries < 1000*n {
			addr = fmt.Sprintf("127.0.0.1:%d", lo+portRand.IntN(hi-lo))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr != "127.0.0.1:0" {
				continue // taken: try another
			}
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

// portRand picks ports; seeded per process so that test binaries running
// at the same time start from different ports.
var portRand = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))

// fixedPortRange is where FreeAddrs picks ports: from 10000 up to the
// kernel's first ephemeral port (an empty range when that is unknown or
// too low, and FreeAddrs asks the kernel instead).
func fixedPortRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	first, err := strconv.Atoi(f[0])
	if err != nil || first <= 11000 {
		return 0, 0
	}
	return 10000, first
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
