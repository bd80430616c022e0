package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "queen e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// writeLeaf writes a server certificate for 127.0.0.1 with serial, and its
// key, to certFile and keyFile, each replaced at once (a rename), as a
// renewal tool does.
func (ca *testCA) writeLeaf(t *testing.T, serial int64, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "queen e2e"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		path string
		pem  *pem.Block
	}{{keyFile, &pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}}, {certFile, &pem.Block{Type: "CERTIFICATE", Bytes: der}}} {
		tmp := f.path + ".new"
		if err := os.WriteFile(tmp, pem.EncodeToMemory(f.pem), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.path); err != nil {
			t.Fatal(err)
		}
	}
}

// servedSerial opens a new TLS connection and returns the serial number of
// the certificate the server presents (verified against roots).
func servedSerial(addr string, roots *x509.CertPool) (int64, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: &tls.Config{RootCAs: roots}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

// TestHTTPS: with QUEEN_TLS_CERT_FILE and QUEEN_TLS_KEY_FILE the API is
// served over HTTPS, and a renewed certificate written over the files is
// presented to new connections without a restart.
func TestHTTPS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	ca.writeLeaf(t, 100, certFile, keyFile)
	s := startServer(t, withTLS(certFile, keyFile, ca.pool))
	if !strings.HasPrefix(s.base, "https://") {
		t.Fatalf("harness base %s", s.base)
	}
	s.pushN(t, "tls-q", "p", 2)
	s.mustPop(t, "tls-q", "consumerGroup=g&subscriptionMode=all&batch=2", 2)
	if n, err := servedSerial(s.httpAddr, ca.pool); err != nil || n != 100 {
		t.Fatalf("served certificate serial %d (%v), want 100", n, err)
	}
	// Plain HTTP on the HTTPS port is refused.
	resp, err := http.Get("http://" + s.httpAddr + "/health")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatalf("plain HTTP answered 200 on the HTTPS port")
		}
	}

	ca.writeLeaf(t, 200, certFile, keyFile)
	err = checkFor(10*time.Second, 50*time.Millisecond, func() error {
		n, err := servedSerial(s.httpAddr, ca.pool)
		if err != nil {
			return err
		}
		if n != 200 {
			return fmt.Errorf("still serving serial %d", n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the renewed certificate was not served: %v", err)
	}
	s.hc.CloseIdleConnections()
	s.callJSON(t, "GET", "/api/v1/resources/queues/tls-q", nil, 200, nil)
	if !strings.Contains(s.logTail(), "TLS certificate reloaded") {
		t.Errorf("no log line for the reload")
	}

	// A half-written renewal (a key that does not match) keeps the
	// certificate that works.
	if err := os.WriteFile(keyFile, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past the reloader's once-a-second check
	for i := 0; i < 3; i++ {
		if n, err := servedSerial(s.httpAddr, ca.pool); err != nil || n != 200 {
			t.Fatalf("with a broken key file: serial %d (%v), want the working 200", n, err)
		}
	}
}

// TestHTTPSNeedsBoth: one of the two TLS settings alone stops the start
// with an error naming the other.
func TestHTTPSNeedsBoth(t *testing.T) {
	t.Parallel()
	addrs := freeAddrs(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, queenBin, "serve") // a server that starts anyway is killed, and fails the test
	cmd.Env = append(os.Environ(), "QUEEN_HTTP_ADDR="+addrs[0], "QUEEN_RAFT_ADDR="+addrs[1], "QUEEN_DATA_DIR="+t.TempDir(),
		"QUEEN_TLS_CERT_FILE="+filepath.Join(t.TempDir(), "server.crt"))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "QUEEN_TLS_KEY_FILE") {
		t.Fatalf("want a failed start naming QUEEN_TLS_KEY_FILE; err %v, output:\n%s", err, out)
	}
}
