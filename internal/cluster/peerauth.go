package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"time"
)

// Peer authentication on the node port. Every connection, raft's and the
// node RPC's alike, is authenticated in both directions before its
// protocol byte is read, so nothing a stranger sends is ever decoded.
//
// Two ways, which may be combined:
//
//   - Mutual TLS: each node has a certificate signed by the cluster's CA
//     (PeerTLSCertFile, PeerTLSKeyFile, PeerTLSCAFile); each side verifies
//     the other's chain against that CA.
//   - A cluster key shared by every node (ClusterKey): the connection is
//     TLS 1.3 with a throwaway certificate (encryption only), and each side
//     then proves the key with an HMAC-SHA256 over keying material exported
//     from that TLS session. The material is fresh for every connection
//     (both sides' random nonces go into it) and differs on the two legs of
//     a man in the middle, so a proof can be neither replayed nor relayed,
//     and the key never crosses the wire.
//
// Without either, the node port is open; Open refuses that on any address
// but loopback.

// MinClusterKeyLen is the shortest cluster key accepted.
const MinClusterKeyLen = 32

// authTimeout bounds a whole handshake, on either side.
const authTimeout = 10 * time.Second

// maxPendingAuth bounds the connections that are accepted but not yet
// authenticated; more are closed at once.
const maxPendingAuth = 256

const (
	ekmLabel    = "queen peer key v1"
	proofDialer = "queen dialer"
	proofServer = "queen listener"
)

var errPeerRefused = errors.New("the peer did not prove the cluster key")

// peerAuth holds what a node needs to authenticate its peers.
type peerAuth struct {
	key       []byte      // cluster key; nil: none
	server    *tls.Config // nil: no TLS (open node port)
	client    *tls.Config
	mutualTLS bool
}

// newPeerAuth checks the settings and builds the TLS configurations. Both
// nil (no key, no files) means an open node port.
func newPeerAuth(cfg *Config) (*peerAuth, error) {
	pa := &peerAuth{}
	if cfg.ClusterKey != "" {
		if len(cfg.ClusterKey) < MinClusterKeyLen {
			return nil, fmt.Errorf("QUEEN_CLUSTER_KEY is %d bytes; use at least %d random bytes, the same on every node (e.g. `openssl rand -base64 32`)", len(cfg.ClusterKey), MinClusterKeyLen)
		}
		pa.key = []byte(cfg.ClusterKey)
	}
	files := 0
	for _, f := range []string{cfg.PeerTLSCertFile, cfg.PeerTLSKeyFile, cfg.PeerTLSCAFile} {
		if f != "" {
			files++
		}
	}
	switch {
	case files == 3:
		cert, err := tls.LoadX509KeyPair(cfg.PeerTLSCertFile, cfg.PeerTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("QUEEN_PEER_TLS_CERT_FILE / QUEEN_PEER_TLS_KEY_FILE: %w (point them at this node's PEM certificate and its key)", err)
		}
		caPEM, err := os.ReadFile(cfg.PeerTLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("QUEEN_PEER_TLS_CA_FILE: %w (point it at the PEM certificate of the CA that signs every node's certificate)", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("QUEEN_PEER_TLS_CA_FILE %s holds no PEM certificate", cfg.PeerTLSCAFile)
		}
		verify := verifyChain(pool)
		pa.mutualTLS = true
		pa.server = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
			ClientAuth: tls.RequireAnyClientCert, VerifyPeerCertificate: verify}
		// Peers are dialed by raft address, which need not be in their
		// certificate: the chain to the cluster's CA is what is checked.
		pa.client = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
			InsecureSkipVerify: true, VerifyPeerCertificate: verify}
	case files > 0:
		return nil, errors.New("peer TLS needs all three of QUEEN_PEER_TLS_CERT_FILE, QUEEN_PEER_TLS_KEY_FILE and QUEEN_PEER_TLS_CA_FILE; set the missing ones or unset them all")
	case pa.key != nil:
		cert, err := throwawayCert()
		if err != nil {
			return nil, err
		}
		pa.server = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
		// The certificate carries no trust: the key proof below does.
		pa.client = &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	}
	return pa, nil
}

// enabled reports whether peers must authenticate.
func (pa *peerAuth) enabled() bool { return pa != nil && pa.server != nil }

// describe names the mode for logs.
func (pa *peerAuth) describe() string {
	switch {
	case !pa.enabled():
		return "off"
	case pa.mutualTLS && pa.key != nil:
		return "mutual TLS and cluster key"
	case pa.mutualTLS:
		return "mutual TLS"
	default:
		return "cluster key"
	}
}

// verifyChain checks a peer's certificate chain against the cluster's CA.
func verifyChain(pool *x509.CertPool) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("the peer sent no certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, b := range raw {
			c, err := x509.ParseCertificate(b)
			if err != nil {
				return fmt.Errorf("peer certificate: %w", err)
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if err != nil {
			return fmt.Errorf("peer certificate is not signed by QUEEN_PEER_TLS_CA_FILE: %w", err)
		}
		return nil
	}
}

// throwawayCert is a self-signed certificate for the cluster-key mode's
// encryption; nobody verifies it.
func throwawayCert() (tls.Certificate, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate the node port's TLS key: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "queen node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(100 * 365 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create the node port's TLS certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}, nil
}

// peerConn is an authenticated connection. Close closes the TCP connection
// at once (no TLS close_notify, which could block on a cut-off peer).
type peerConn struct {
	*tls.Conn
	raw net.Conn
}

func (c *peerConn) Close() error { return c.raw.Close() }

// accept authenticates the listening side of c. On error c is closed.
func (pa *peerAuth) accept(c net.Conn) (net.Conn, error) {
	if !pa.enabled() {
		return c, nil
	}
	return pa.handshake(c, tls.Server(c, pa.server), false)
}

// dial authenticates the dialing side of c. On error c is closed.
func (pa *peerAuth) dial(c net.Conn, deadline time.Time) (net.Conn, error) {
	if !pa.enabled() {
		return c, nil
	}
	c.SetDeadline(deadline)
	pc, err := pa.handshake(c, tls.Client(c, pa.client), true)
	if err == nil {
		c.SetDeadline(time.Time{})
	}
	return pc, err
}

func (pa *peerAuth) handshake(raw net.Conn, tc *tls.Conn, dialer bool) (net.Conn, error) {
	fail := func(err error) (net.Conn, error) {
		raw.Close()
		return nil, err
	}
	if err := tc.Handshake(); err != nil {
		return fail(fmt.Errorf("TLS handshake: %w", err))
	}
	if pa.key != nil {
		cs := tc.ConnectionState()
		ekm, err := cs.ExportKeyingMaterial(ekmLabel, nil, 32)
		if err != nil {
			return fail(fmt.Errorf("export TLS keying material: %w", err))
		}
		mine, theirs := proofServer, proofDialer
		if dialer {
			mine, theirs = proofDialer, proofServer
		}
		// The dialer proves first, so a stranger learns nothing.
		if dialer {
			if _, err := tc.Write(pa.proof(mine, ekm)); err != nil {
				return fail(fmt.Errorf("send the key proof: %w", err))
			}
		}
		got := make([]byte, sha256.Size)
		if _, err := io.ReadFull(tc, got); err != nil {
			if dialer {
				return fail(fmt.Errorf("%w (it closed the connection: is QUEEN_CLUSTER_KEY the same on both nodes?): %v", errPeerRefused, err))
			}
			return fail(fmt.Errorf("read the key proof: %w", err))
		}
		if !hmac.Equal(got, pa.proof(theirs, ekm)) {
			return fail(fmt.Errorf("%w: its QUEEN_CLUSTER_KEY differs from this node's", errPeerRefused))
		}
		if !dialer {
			if _, err := tc.Write(pa.proof(mine, ekm)); err != nil {
				return fail(fmt.Errorf("send the key proof: %w", err))
			}
		}
	}
	return &peerConn{Conn: tc, raw: raw}, nil
}

func (pa *peerAuth) proof(role string, ekm []byte) []byte {
	m := hmac.New(sha256.New, pa.key)
	m.Write([]byte(role))
	m.Write(ekm)
	return m.Sum(nil)
}

// isLoopback reports whether a listener only takes connections from this
// machine.
func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP != nil && tcp.IP.IsLoopback()
}
