package certreload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePair writes a self-signed certificate with serial and its key.
func writePair(t *testing.T, serial int64, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "t"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func serial(t *testing.T, r *Reloader) int64 {
	t.Helper()
	c, err := r.GetCertificate(nil)
	if err != nil || c == nil {
		t.Fatalf("GetCertificate: %v", err)
	}
	x, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return x.SerialNumber.Int64()
}

// TestReload: changed files are picked up at the next check; a pair that
// does not load keeps the previous certificate; a missing file at start
// is an error naming its setting.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	cf, kf := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	if _, err := New(cf, kf, nil); err == nil || !strings.Contains(err.Error(), "QUEEN_TLS_CERT_FILE") {
		t.Fatalf("missing files: %v, want an error naming QUEEN_TLS_CERT_FILE", err)
	}
	writePair(t, 1, cf, kf)
	r, err := New(cf, kf, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := serial(t, r); n != 1 {
		t.Fatalf("serial %d, want 1", n)
	}
	writePair(t, 2, cf, kf)
	if n := serial(t, r); n != 1 {
		t.Fatalf("serial %d within the check interval, want 1 still", n)
	}
	r.mu.Lock()
	r.lastCheck = time.Time{}
	r.mu.Unlock()
	if n := serial(t, r); n != 2 {
		t.Fatalf("serial %d after the files changed, want 2", n)
	}
	if err := os.WriteFile(kf, []byte("half written"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.lastCheck = time.Time{}
	r.mu.Unlock()
	if n := serial(t, r); n != 2 {
		t.Fatalf("serial %d with a broken key, want the working 2", n)
	}
}
