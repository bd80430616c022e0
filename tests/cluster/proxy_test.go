package cluster

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// faultNet is a set of TCP proxies, one in front of each node's raft port
// (the address the node advertises). Every node dials from its own loopback
// IP, so a proxy knows which node a connection comes from, and the links
// between two nodes can be cut in either direction. A cut link is a black
// hole, as in a real partition: the dialer's connection stays open and its
// bytes go nowhere, so it learns nothing until its own timeouts fire.
type faultNet struct {
	mu      sync.Mutex
	srcByIP map[string]int
	blocked map[[2]int]bool
	links   map[*link]struct{}
	lns     []net.Listener
}

type link struct {
	src, dst int
	client   net.Conn
	upstream net.Conn // nil when accepted into a black hole
	holed    atomic.Bool
}

func newFaultNet(t testing.TB) *faultNet {
	f := &faultNet{srcByIP: map[string]int{}, blocked: map[[2]int]bool{}, links: map[*link]struct{}{}}
	t.Cleanup(f.close)
	return f
}

// addNode registers node i's source IP and starts its proxy to target; it
// returns the proxy's address (the node's advertised raft address).
func (f *faultNet) addNode(t testing.TB, i int, sourceIP, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.srcByIP[sourceIP] = i
	f.lns = append(f.lns, ln)
	f.mu.Unlock()
	go f.accept(ln, i, target)
	return ln.Addr().String()
}

func (f *faultNet) accept(ln net.Listener, dst int, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		f.mu.Lock()
		src, ok := f.srcByIP[host]
		if !ok {
			src = -1
		}
		l := &link{src: src, dst: dst, client: c}
		blocked := f.blocked[[2]int{src, dst}]
		f.links[l] = struct{}{}
		f.mu.Unlock()
		if blocked {
			l.holed.Store(true)
			go l.sink()
			continue
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			f.drop(l)
			continue
		}
		l.upstream = up
		go l.forward()
		go l.backward(f)
	}
}

// sink reads and discards until the connection closes.
func (l *link) sink() {
	buf := make([]byte, 32<<10)
	for {
		if _, err := l.client.Read(buf); err != nil {
			return
		}
	}
}

func (l *link) forward() {
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 && !l.holed.Load() {
			l.upstream.Write(buf[:n])
		}
		if err != nil {
			l.upstream.Close()
			return
		}
	}
}

func (l *link) backward(f *faultNet) {
	buf := make([]byte, 32<<10)
	for {
		n, err := l.upstream.Read(buf)
		if n > 0 && !l.holed.Load() {
			l.client.Write(buf[:n])
		}
		if err != nil {
			if !l.holed.Load() {
				f.drop(l)
			}
			return
		}
	}
}

func (f *faultNet) drop(l *link) {
	f.mu.Lock()
	delete(f.links, l)
	f.mu.Unlock()
	l.client.Close()
	if l.upstream != nil {
		l.upstream.Close()
	}
}

// isolate cuts node i off from every other node, both ways.
func (f *faultNet) isolate(i int, nodes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for j := 0; j < nodes; j++ {
		if j != i {
			f.blocked[[2]int{i, j}] = true
			f.blocked[[2]int{j, i}] = true
		}
	}
	for l := range f.links {
		if f.blocked[[2]int{l.src, l.dst}] && !l.holed.Load() {
			l.holed.Store(true)
			if l.upstream != nil {
				l.upstream.Close()
			}
		}
	}
}

// heal restores every link; connections that fell into a black hole are
// closed so that their dialers reconnect.
func (f *faultNet) heal() {
	f.mu.Lock()
	f.blocked = map[[2]int]bool{}
	var holed []*link
	for l := range f.links {
		if l.holed.Load() {
			holed = append(holed, l)
			delete(f.links, l)
		}
	}
	f.mu.Unlock()
	for _, l := range holed {
		l.client.Close()
		if l.upstream != nil {
			l.upstream.Close()
		}
	}
}

func (f *faultNet) close() {
	f.mu.Lock()
	lns := f.lns
	links := f.links
	f.links = map[*link]struct{}{}
	f.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for l := range links {
		l.client.Close()
		if l.upstream != nil {
			l.upstream.Close()
		}
	}
}
