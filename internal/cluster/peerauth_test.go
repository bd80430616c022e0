package cluster

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/gob"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	raftpb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/queen-mq/queen/internal/state"
)

// Tests of peerauth.go over the real node port: raw TCP, real TLS, real
// raft transports and in-process clusters.

const (
	testClusterKey  = "test-cluster-key-0123456789abcdef0123456789"
	wrongClusterKey = "another-cluster-key-0123456789abcdef012345"
)

// startClusterWith is startCluster with each node's Config adjusted.
func startClusterWith(t *testing.T, size int, mod func(i int, c *Config)) *testCluster {
	t.Helper()
	tc := &testCluster{t: t}
	var peers []Peer
	for i := 0; i < size; i++ {
		addr := freeAddr(t)
		c := Config{DataDir: filepath.Join(t.TempDir(), fmt.Sprintf("n%d", i+1)), NodeID: fmt.Sprintf("n%d", i+1), RaftAddr: addr,
			HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger()}
		mod(i, &c)
		tc.cfgs = append(tc.cfgs, c)
		peers = append(peers, Peer{ID: c.NodeID, Address: addr})
	}
	for i := range tc.cfgs {
		tc.cfgs[i].Peers = peers
		n, err := Open(tc.cfgs[i])
		if err != nil {
			t.Fatal(err)
		}
		tc.nodes = append(tc.nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range tc.nodes {
			if n != nil {
				n.Close()
			}
		}
	})
	tc.leader()
	return tc
}

// peerDial opens a connection to a node port as a peer would, with pa's
// credentials (nil: none), and writes the protocol byte.
func peerDial(addr string, pa *peerAuth, header byte) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	if pa != nil {
		if c, err = pa.dial(c, time.Now().Add(5*time.Second)); err != nil {
			return nil, err
		}
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte{header}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func testPeerAuth(t *testing.T, cfg Config) *peerAuth {
	t.Helper()
	pa, err := newPeerAuth(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pa
}

// rpcOnce sends one node-RPC request on a fresh connection and reads one
// response.
func rpcOnce(addr string, pa *peerAuth, req *rpcRequest) (*rpcResponse, error) {
	c, err := peerDial(addr, pa, headerRPC)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	bw := bufio.NewWriter(c)
	if err := gob.NewEncoder(bw).Encode(req); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	var resp rpcResponse
	if err := gob.NewDecoder(c).Decode(&resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// stolenPush is what the attack of the issue sent: a push for tenant
// globex, as a forwarded command.
func stolenPush(t *testing.T) *rpcRequest {
	t.Helper()
	entry, err := state.EncodeEntry(&state.Entry{Cmds: []state.Command{&state.Push{Tenant: "globex",
		Items: []state.PushItem{{Queue: "stolen", Partition: "p", TxID: "x", Payload: []byte(`{"evil":true}`)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return &rpcRequest{Seq: 1, Op: opSubmit, ReqID: newReqID(), Entry: entry, Size: 64, TimeoutNs: int64(5 * time.Second)}
}

func queueExists(n *Node, tenant, queue string) bool {
	rd := n.Store().Reader()
	defer rd.Close()
	_, ok := rd.Queue(tenant, queue)
	return ok
}

type voteResult struct{ Read bool }

// requestVote sends a raft vote request for term to addr as the transport
// does (a hello, then the message) with pa's credentials. A node that
// accepts the connection reads it and keeps it open (its answer would go
// to the sender's own address); a node that refuses it closes it.
func requestVote(t *testing.T, addr string, pa *peerAuth, term uint64) (*voteResult, error) {
	t.Helper()
	c, err := peerDial(addr, pa, headerRaft)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	from := raftID("intruder")
	h, _ := json.Marshal(&hello{From: from, ID: "intruder", Addr: "127.0.0.1:1"})
	m, _ := proto.Marshal(&raftpb.Message{Type: raftpb.MsgVote.Enum(), To: new(raftID("n1")), From: new(from), Term: new(term), LogTerm: new(term), Index: new(uint64(1 << 40))})
	var buf bytes.Buffer
	writeFrame(&buf, h)
	writeFrame(&buf, m)
	if _, err := c.Write(buf.Bytes()); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return &voteResult{Read: true}, nil
		}
		return nil, fmt.Errorf("the node closed the connection: %w", err)
	}
	return nil, errors.New("the node wrote on a raft connection")
}

func terms(tc *testCluster) []uint64 {
	var out []uint64
	for _, n := range tc.nodes {
		out = append(out, n.Term())
	}
	return out
}

// TestNodePortRefusesStrangers: with a cluster key, a client without it
// (or with another key) gets nothing decoded: a forwarded push is not
// applied, a raft vote request does not move the term, a status request
// returns no checksum. With the key, the same requests are answered.
func TestNodePortRefusesStrangers(t *testing.T) {
	tc := startClusterWith(t, 3, func(i int, c *Config) { c.ClusterKey = testClusterKey })
	l := tc.leader()
	addr := l.Address()
	wrong := testPeerAuth(t, Config{ClusterKey: wrongClusterKey})
	right := testPeerAuth(t, Config{ClusterKey: testClusterKey})

	for _, cred := range []struct {
		name string
		pa   *peerAuth
	}{{"no key", nil}, {"wrong key", wrong}} {
		resp, err := rpcOnce(addr, cred.pa, stolenPush(t))
		if err == nil {
			t.Fatalf("%s: the forwarded push was answered: %+v", cred.name, resp)
		}
		resp, err = rpcOnce(addr, cred.pa, &rpcRequest{Seq: 1, Op: opStatus, Checksum: true})
		if err == nil {
			t.Fatalf("%s: the status request was answered (checksum %q)", cred.name, resp.Node.Checksum)
		}
		before := terms(tc)
		if _, err := requestVote(t, addr, cred.pa, before[0]+100); err == nil {
			t.Fatalf("%s: the raft vote request was answered", cred.name)
		}
		if after := terms(tc); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("%s: terms moved from %v to %v on a stranger's vote request", cred.name, before, after)
		}
		if cred.pa != nil && !strings.Contains(err.Error(), "cluster key") {
			t.Errorf("%s: the dialer's error does not say what is wrong: %v", cred.name, err)
		}
	}
	// A stranger who closes the connection at once, or sends garbage, leaves
	// the port working.
	for _, junk := range [][]byte{nil, []byte("Q"), []byte("R\x00\x01garbage"), make([]byte, 4096)} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk)
		c.Close()
	}
	for _, n := range tc.nodes {
		if queueExists(n, "globex", "stolen") {
			t.Fatalf("%s has the stranger's queue", n.ID())
		}
	}

	// The right key: the status request is answered and the vote request
	// read (raft itself ignores it: the vote, for the current term from a
	// non-member, is no reason to change anything), so the refusals above
	// came from the missing key.
	resp, err := rpcOnce(addr, right, &rpcRequest{Seq: 1, Op: opStatus, Checksum: true})
	if err != nil || resp.Node == nil || resp.Node.Checksum == "" {
		t.Fatalf("status with the right key: %+v %v", resp, err)
	}
	if v, err := requestVote(t, addr, right, l.Term()); err != nil || !v.Read {
		t.Fatalf("vote request with the right key: %+v %v", v, err)
	}
	ctx := ctxT(t, 10*time.Second)
	if _, err := tc.follower().Submit(ctx, kvPut("ok", `1`, nil), 64); err != nil {
		t.Fatalf("a write through a follower (node RPC and raft, both with the key): %v", err)
	}
}

// TestNodePortRefusesOpenNonLoopback: a node will not listen for peers off
// loopback without a cluster key or peer TLS, and says what to set.
func TestNodePortRefusesOpenNonLoopback(t *testing.T) {
	port := freeAddr(t)[len("127.0.0.1:"):]
	cfg := Config{DataDir: t.TempDir(), NodeID: "n1", RaftAddr: "0.0.0.0:" + port, Advertise: "127.0.0.1:" + port, Logger: quietLogger()}
	_, err := Open(cfg)
	if err == nil {
		t.Fatal("a node listened for peers on 0.0.0.0 without authentication")
	}
	for _, want := range []string{"QUEEN_CLUSTER_KEY", "QUEEN_PEER_TLS_CERT_FILE", "0.0.0.0:" + port} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	short := cfg
	short.ClusterKey = "short"
	if _, err := Open(short); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("a 5-byte cluster key: %v", err)
	}
	partial := cfg
	partial.PeerTLSCertFile = "/nonexistent.pem"
	if _, err := Open(partial); err == nil || !strings.Contains(err.Error(), "QUEEN_PEER_TLS_CA_FILE") {
		t.Errorf("only one peer TLS file: %v", err)
	}
	cfg.ClusterKey = testClusterKey
	n, err := Open(cfg)
	if err != nil {
		t.Fatalf("with a cluster key: %v", err)
	}
	defer n.Close()
	if err := n.WaitLeader(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// testPKI writes a CA and certificates it signs into dir.
type testPKI struct {
	dir  string
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA's PEM file
}

func newTestPKI(t *testing.T, name string) *testPKI {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &testPKI{dir: t.TempDir(), ca: ca, key: k}
	p.file = p.write(t, name+"-ca.pem", "CERTIFICATE", der)
	return p
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// leaf issues a certificate for name; it returns the cert and key files.
func (p *testPKI) leaf(t *testing.T, name string) (string, string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "PRIVATE KEY", kd)
}

// TestPeerMutualTLS: nodes with certificates of one CA form a cluster; a
// client with a certificate of another CA, or with none, is refused
// before anything is decoded.
func TestPeerMutualTLS(t *testing.T) {
	pki := newTestPKI(t, "cluster")
	tc := startClusterWith(t, 3, func(i int, c *Config) {
		c.PeerTLSCertFile, c.PeerTLSKeyFile = pki.leaf(t, c.NodeID)
		c.PeerTLSCAFile = pki.file
	})
	ctx := ctxT(t, 10*time.Second)
	if _, err := tc.follower().Submit(ctx, kvPut("k", `1`, nil), 64); err != nil {
		t.Fatalf("a write through a follower over mutual TLS: %v", err)
	}
	addr := tc.leader().Address()

	rogue := newTestPKI(t, "rogue")
	rc, rk := rogue.leaf(t, "intruder")
	rogueAuth := testPeerAuth(t, Config{PeerTLSCertFile: rc, PeerTLSKeyFile: rk, PeerTLSCAFile: pki.file})
	if _, err := rpcOnce(addr, rogueAuth, stolenPush(t)); err == nil {
		t.Fatal("a certificate of another CA was let in")
	}
	// No client certificate at all.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	noCert := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	noCert.SetDeadline(time.Now().Add(5 * time.Second))
	_, werr := noCert.Write([]byte{headerRPC})
	var one [1]byte
	_, rerr := noCert.Read(one[:])
	noCert.Close()
	if werr == nil && rerr == nil {
		t.Fatal("a client without a certificate got an answer")
	}
	// A client that speaks no TLS.
	if _, err := rpcOnce(addr, nil, stolenPush(t)); err == nil {
		t.Fatal("a plain client was let in")
	}
	for _, n := range tc.nodes {
		if queueExists(n, "globex", "stolen") {
			t.Fatalf("%s has the stranger's queue", n.ID())
		}
	}
	// A certificate of the cluster's CA is let in (so the refusals above
	// were about the certificate).
	gc, gk := pki.leaf(t, "tool")
	good := testPeerAuth(t, Config{PeerTLSCertFile: gc, PeerTLSKeyFile: gk, PeerTLSCAFile: pki.file})
	resp, err := rpcOnce(addr, good, &rpcRequest{Seq: 1, Op: opStatus})
	if err != nil || resp.Node == nil {
		t.Fatalf("status with a certificate of the cluster's CA: %+v %v", resp, err)
	}
}

// TestJoinRefusesUnreachable: a join of a node that does not answer on its
// node port, or answers without the cluster key, or under another id, is
// refused and changes nothing; the cluster keeps its quorum when one of
// its three nodes then stops. A node with the key joins (as a non-voter
// first, then a voter).
func TestJoinRefusesUnreachable(t *testing.T) {
	tc := startClusterWith(t, 3, func(i int, c *Config) { c.ClusterKey = testClusterKey })
	ctx := ctxT(t, 60*time.Second)
	var e *Error
	err := tc.follower().Join(ctx, "n4", freeAddr(t))
	if !errors.As(err, &e) || e.Code != "join_unreachable" {
		t.Fatalf("join of a node nobody listens for: %v", err)
	}

	stranger := Config{DataDir: t.TempDir(), NodeID: "n4", RaftAddr: freeAddr(t), Join: true, ClusterKey: wrongClusterKey,
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger()}
	n4, err := Open(stranger)
	if err != nil {
		t.Fatal(err)
	}
	err = tc.leader().Join(ctx, "n4", stranger.RaftAddr)
	n4.Close()
	if !errors.As(err, &e) || e.Code != "join_unreachable" || !strings.Contains(e.Message, "QUEEN_CLUSTER_KEY") {
		t.Fatalf("join of a node with another cluster key: %v", err)
	}

	good := stranger
	good.DataDir, good.RaftAddr, good.ClusterKey = t.TempDir(), freeAddr(t), testClusterKey
	joiner, err := Open(good)
	if err != nil {
		t.Fatal(err)
	}
	defer joiner.Close()
	if err := tc.leader().Join(ctx, "n5", good.RaftAddr); !errors.As(err, &e) || e.Code != "join_wrong_node" {
		t.Fatalf("join under another id than the node's: %v", err)
	}
	if got := len(tc.leader().voters()); got != 3 {
		t.Fatalf("voters after the refused joins: %d, want 3", got)
	}

	// One node of three stops: two voters of three are a quorum.
	victim := tc.follower()
	for i, n := range tc.nodes {
		if n == victim {
			tc.nodes[i] = nil
		}
	}
	victim.Close()
	var live *Node
	for _, n := range tc.nodes {
		if n != nil {
			live = n
		}
	}
	wctx := ctxT(t, 10*time.Second)
	if _, err := live.Submit(wctx, kvPut("after", `1`, nil), 64); err != nil {
		t.Fatalf("write after one of three nodes stopped: %v", err)
	}

	// The right node with the key joins and becomes a voter.
	if err := live.Join(ctx, "n4", good.RaftAddr); err != nil {
		t.Fatalf("join with the key: %v", err)
	}
	found := false
	for _, s := range live.voters() {
		found = found || string(s.ID) == "n4"
	}
	if !found {
		t.Fatalf("n4 is not a voter after its join: %+v", live.voters())
	}
	if err := joiner.ReadBarrier(wctx); err != nil {
		t.Fatalf("the joined node cannot read: %v", err)
	}
}

// TestNonvoterPromotedByTheLeader: a non-voter whose join request went
// away (as when the joining node restarts mid-join) is made a voter by the
// leader once it has caught up.
func TestNonvoterPromotedByTheLeader(t *testing.T) {
	tc := startCluster(t, 3)
	ctx := ctxT(t, 30*time.Second)
	for i := 0; i < 50; i++ {
		if _, err := tc.nodes[i%3].Submit(ctx, kvPut(fmt.Sprintf("k%d", i), `1`, nil), 64); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{DataDir: t.TempDir(), NodeID: "n4", RaftAddr: freeAddr(t), Join: true,
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond, Logger: quietLogger()}
	l := tc.leader()
	n4, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tc.nodes = append(tc.nodes, n4)
	// What a join does before it waits: add the node as a non-voter.
	if err := l.changeConf(ctx, raftpb.ConfChangeAddLearnerNode, "n4", cfg.RaftAddr); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		voter := false
		for _, s := range l.voters() {
			voter = voter || s.ID == "n4"
		}
		if voter {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n4 is still not a voter 15 s after it was added as a non-voter: %+v", l.Members())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := n4.ReadBarrier(ctx); err != nil {
		t.Fatal(err)
	}
	rd := n4.Store().Reader()
	_, ok := rd.KVGet("default", "k49", time.Now().UnixMicro())
	rd.Close()
	if !ok {
		t.Fatal("the promoted node lacks data written before it joined")
	}
}
