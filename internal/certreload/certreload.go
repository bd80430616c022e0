// Package certreload serves a TLS certificate from a pair of PEM files and
// picks up new files without a restart: a renewed certificate is used by
// the next connection.
package certreload

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// checkEvery spaces the checks of the files' modification times.
const checkEvery = time.Second

// Reloader holds the certificate of a cert and key file pair.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu        sync.Mutex
	cert      *tls.Certificate
	certMod   time.Time
	keyMod    time.Time
	lastCheck time.Time
	failing   bool // the files changed but do not load (yet)
}

// New loads the pair once; an error names the file at fault.
func New(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.Default()
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: log}
	cm, km, err := r.mtimes()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s (QUEEN_TLS_CERT_FILE, QUEEN_TLS_KEY_FILE): %w", certFile, keyFile, err)
	}
	r.cert, r.certMod, r.keyMod, r.lastCheck = &cert, cm, km, time.Now()
	return r, nil
}

func (r *Reloader) mtimes() (cert, key time.Time, err error) {
	ci, err := os.Stat(r.certFile)
	if err != nil {
		return cert, key, fmt.Errorf("TLS certificate file (QUEEN_TLS_CERT_FILE): %w", err)
	}
	ki, err := os.Stat(r.keyFile)
	if err != nil {
		return cert, key, fmt.Errorf("TLS key file (QUEEN_TLS_KEY_FILE): %w", err)
	}
	return ci.ModTime(), ki.ModTime(), nil
}

// GetCertificate is tls.Config.GetCertificate: the current certificate,
// reloaded first when either file changed. While new files do not load
// (a key written after its certificate, say) the previous certificate
// stays in use.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.lastCheck) < checkEvery {
		return r.cert, nil
	}
	r.lastCheck = time.Now()
	cm, km, err := r.mtimes()
	if err != nil {
		r.warn("TLS files unreadable; serving the certificate loaded before", err)
		return r.cert, nil
	}
	if cm.Equal(r.certMod) && km.Equal(r.keyMod) {
		return r.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		r.warn("the TLS files changed but do not load; serving the certificate loaded before until they do (write the key and certificate as a matching pair)", err)
		return r.cert, nil
	}
	r.cert, r.certMod, r.keyMod, r.failing = &cert, cm, km, false
	r.log.Info("TLS certificate reloaded", "cert", r.certFile, "key", r.keyFile)
	return r.cert, nil
}

func (r *Reloader) warn(msg string, err error) {
	if !r.failing {
		r.log.Warn(msg, "cert", r.certFile, "key", r.keyFile, "err", err)
	}
	r.failing = true
}

// TLSConfig is a server configuration serving the reloaded certificate.
func (r *Reloader) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}
