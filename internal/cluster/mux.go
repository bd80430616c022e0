package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// One TCP port carries two protocols. The first byte a dialer writes on a
// connection says which: raft messages (handed to transport.go), or
// this package's node-to-node RPC (forwarding, read index, membership,
// status). Followers reach the leader's RPC at the leader's raft address,
// so no second address is configured anywhere. Before that byte, both
// sides authenticate (peerauth.go) when a cluster key or peer TLS is set.
const (
	headerRaft byte = 'R'
	headerRPC  byte = 'Q'
)

// headerTimeout bounds how long an accepted connection may take to send its
// header byte.
const headerTimeout = 10 * time.Second

var errLayerClosed = errors.New("cluster: stream layer closed")

// errOpenNodePort refuses an unauthenticated node port off loopback.
var errOpenNodePort = errors.New("refusing to listen for peers without authentication")

// muxLayer is the node port's listener: it hands raft connections to the
// transport and serves the node RPC.
type muxLayer struct {
	ln        net.Listener
	advertise net.Addr
	dialer    net.Dialer
	log       *slog.Logger
	auth      *peerAuth
	pending   chan struct{} // one token per connection still authenticating
	lastWarn  atomic.Int64  // unix nanos of the last refused-peer warning

	raftConns chan net.Conn
	rpc       func(net.Conn) // serves one node-RPC connection; set before serving

	closeOnce sync.Once
	closing   chan struct{}

	mu    sync.Mutex
	conns map[net.Conn]struct{} // node-RPC server connections, closed on Close
}

func newMuxLayer(bind string, advertise net.Addr, sourceIP string, pa *peerAuth, log *slog.Logger) (*muxLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	if !pa.enabled() && !isLoopback(ln.Addr()) {
		ln.Close()
		return nil, fmt.Errorf("%w on %s (QUEEN_RAFT_ADDR): anyone who reaches it could change the data; set QUEEN_CLUSTER_KEY (at least %d random bytes, the same on every node, e.g. `openssl rand -base64 32`) or QUEEN_PEER_TLS_CERT_FILE, QUEEN_PEER_TLS_KEY_FILE and QUEEN_PEER_TLS_CA_FILE, or bind QUEEN_RAFT_ADDR to 127.0.0.1", errOpenNodePort, bind, MinClusterKeyLen)
	}
	if tcp, ok := advertise.(*net.TCPAddr); !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("raft address %v cannot be dialed by other nodes: set QUEEN_RAFT_ADVERTISE (or QUEEN_RAFT_ADDR) to a host:port they can reach", advertise)
	}
	m := &muxLayer{
		ln: ln, advertise: advertise, log: log, auth: pa,
		pending:   make(chan struct{}, maxPendingAuth),
		raftConns: make(chan net.Conn, 16),
		closing:   make(chan struct{}),
		conns:     map[net.Conn]struct{}{},
	}
	if sourceIP != "" {
		ip := net.ParseIP(sourceIP)
		if ip == nil {
			ln.Close()
			return nil, fmt.Errorf("source IP %q is not an IP address", sourceIP)
		}
		m.dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	return m, nil
}

// serve accepts connections until Close.
func (m *muxLayer) serve() {
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.closing:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.log.Warn("raft listener accept failed", "err", err)
			select {
			case <-m.closing:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if m.auth.enabled() {
			select {
			case m.pending <- struct{}{}:
			default:
				m.refused(c.RemoteAddr(), fmt.Errorf("%d connections are already authenticating", maxPendingAuth))
				c.Close()
				continue
			}
		}
		go m.route(c)
	}
}

func (m *muxLayer) route(c net.Conn) {
	var b [1]byte
	if m.auth.enabled() {
		c.SetDeadline(time.Now().Add(authTimeout))
		ac, err := m.auth.accept(c)
		<-m.pending
		if err != nil {
			m.refused(c.RemoteAddr(), err)
			return
		}
		c = ac
	}
	c.SetReadDeadline(time.Now().Add(headerTimeout))
	if _, err := c.Read(b[:]); err != nil {
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	switch b[0] {
	case headerRaft:
		select {
		case m.raftConns <- c:
		case <-m.closing:
			c.Close()
		}
	case headerRPC:
		if !m.track(c) {
			c.Close()
			return
		}
		defer m.untrack(c)
		m.rpc(c)
	default:
		m.log.Debug("closing connection with an unknown protocol byte", "remote", c.RemoteAddr().String(), "byte", b[0])
		c.Close()
	}
}

// refused logs a connection that failed to authenticate: a warning at most
// every 10 s (a misconfigured peer redials constantly), debug otherwise.
func (m *muxLayer) refused(remote net.Addr, err error) {
	now := time.Now().UnixNano()
	if last := m.lastWarn.Load(); now-last > int64(10*time.Second) && m.lastWarn.CompareAndSwap(last, now) {
		m.log.Warn("refused a connection on the node port: it did not authenticate; every node needs the same QUEEN_CLUSTER_KEY (or a certificate signed by QUEEN_PEER_TLS_CA_FILE)",
			"remote", remote.String(), "err", err)
		return
	}
	m.log.Debug("refused a connection on the node port", "remote", remote.String(), "err", err)
}

func (m *muxLayer) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.closing:
		return false
	default:
	}
	m.conns[c] = struct{}{}
	return true
}

func (m *muxLayer) untrack(c net.Conn) {
	m.mu.Lock()
	delete(m.conns, c)
	m.mu.Unlock()
	c.Close()
}

// Accept hands the transport its connections.
func (m *muxLayer) Accept() (net.Conn, error) {
	select {
	case c := <-m.raftConns:
		return c, nil
	case <-m.closing:
		return nil, errLayerClosed
	}
}

// Close stops accepting and closes the node-RPC server connections.
func (m *muxLayer) Close() error {
	var err error
	m.closeOnce.Do(func() {
		m.mu.Lock()
		close(m.closing)
		for c := range m.conns {
			c.Close()
		}
		m.mu.Unlock()
		err = m.ln.Close()
	})
	return err
}

// Addr is the advertised address (what raft tells other nodes).
func (m *muxLayer) Addr() net.Addr { return m.advertise }

func (m *muxLayer) dial(addr string, header byte, timeout time.Duration) (net.Conn, error) {
	d := m.dialer
	d.Timeout = timeout
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if timeout <= 0 || timeout > authTimeout {
		timeout = authTimeout
	}
	if c, err = m.auth.dial(c, time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("authenticate with %s: %w", addr, err)
	}
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{header}); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{})
	return c, nil
}
