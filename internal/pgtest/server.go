package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Password is the password of the superuser "postgres" on every server this
// package starts. Connections over TCP must give it (scram-sha-256).
const Password = "queen-test"

// runUser is the unprivileged account a root test run starts servers as.
const runUser = "queenpg"

// Options change how a Private server starts.
type Options struct {
	// SSL turns on ssl with a certificate for localhost and 127.0.0.1
	// signed by a CA made for this server (Server.CACertPEM).
	SSL bool
	// Settings are extra `-c name=value` settings.
	Settings map[string]string
	// Major picks the version (0: QUEEN_TEST_PG_VERSION, else any >= 17);
	// 16 starts the older server the tests of version checks need.
	Major int
}

// Server is one running PostgreSQL, or the external one of QUEEN_TEST_PG_URL.
type Server struct {
	external string // QUEEN_TEST_PG_URL, when set

	bin, dir, sock string
	port           int
	opts           Options
	cred           *syscall.Credential
	caPEM          []byte

	mu   sync.Mutex
	proc *exec.Cmd
	done chan struct{}
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns the server shared by every test of this test binary,
// starting it on first use. Call Main from TestMain to stop it at the end;
// without it the server still dies with the test process.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.once.Do(func() {
		if u := os.Getenv("QUEEN_TEST_PG_URL"); u != "" {
			shared.s = &Server{external: u}
			return
		}
		shared.s, shared.err = start(Options{})
	})
	if shared.err != nil {
		t.Fatalf("pgtest: %v", shared.err)
	}
	return shared.s
}

// Main runs a package's tests and stops the shared server after them:
// func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }.
func Main(m *testing.M) int {
	code := m.Run()
	if shared.s != nil {
		shared.s.stop()
		shared.s.removeDir()
	}
	return code
}

// Private starts a server of the test's own, stopped and removed when the
// test ends.
func Private(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := start(opts)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		s.stop()
		s.removeDir()
	})
	return s
}

func start(opts Options) (*Server, error) {
	major := opts.Major
	if major == 0 {
		m, err := wantedMajor()
		if err != nil {
			return nil, err
		}
		major = m
	}
	bin, err := binDir(major)
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "queen-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, sock: filepath.Join(dir, "sock"), opts: opts, cred: cred}
	if err := s.initdb(); err != nil {
		s.removeDir()
		return nil, err
	}
	// A port taken between the probe and the bind is retried.
	for attempt := 0; ; attempt++ {
		s.port, err = freePort()
		if err == nil {
			err = s.startProcess()
		}
		if err == nil {
			return s, nil
		}
		if attempt == 3 {
			s.removeDir()
			return nil, err
		}
	}
}

// credential is the user the server runs as: nil (this user) unless root.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(runUser)
	if err != nil {
		out, cerr := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", runUser).CombinedOutput()
		if cerr != nil {
			if u, err = user.Lookup(runUser); err != nil {
				return nil, fmt.Errorf("PostgreSQL cannot run as root and the user %q could not be created (useradd: %v: %s)", runUser, cerr, out)
			}
		} else if u, err = user.Lookup(runUser); err != nil {
			return nil, err
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	lib := filepath.Join(filepath.Dir(s.bin), "lib")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "LC_ALL=C", "TZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	cmd.Dir = s.dir
	return cmd
}

func (s *Server) chown(paths ...string) error {
	if s.cred == nil {
		return nil
	}
	for _, p := range paths {
		if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) initdb() error {
	if err := os.Chmod(s.dir, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(s.sock, 0o755); err != nil {
		return err
	}
	pw := filepath.Join(s.dir, "pwfile")
	if err := os.WriteFile(pw, []byte(Password+"\n"), 0o600); err != nil {
		return err
	}
	if err := s.chown(s.dir, s.sock, pw); err != nil {
		return fmt.Errorf("give %s to the PostgreSQL user: %w", s.dir, err)
	}
	out, err := s.command("initdb", "-D", s.data(), "-U", "postgres", "--pwfile", pw,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	if s.opts.SSL {
		if err := s.makeCertificates(); err != nil {
			return fmt.Errorf("certificates: %w", err)
		}
	}
	return nil
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) settings() []string {
	set := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(s.port),
		"unix_socket_directories": s.sock,
		"wal_level":               "logical",
		"max_replication_slots":   "32",
		"max_wal_senders":         "32",
		"max_connections":         "200",
		"fsync":                   "off",
		"synchronous_commit":      "off",
		"full_page_writes":        "off",
		"timezone":                "UTC",
		"log_timezone":            "UTC",
		"logging_collector":       "off",
	}
	if s.opts.SSL {
		set["ssl"] = "on"
		set["ssl_cert_file"] = filepath.Join(s.dir, "server.crt")
		set["ssl_key_file"] = filepath.Join(s.dir, "server.key")
	}
	for k, v := range s.opts.Settings {
		set[k] = v
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"-D", s.data()}
	for _, k := range keys {
		args = append(args, "-c", k+"="+set[k])
	}
	return args
}

func (s *Server) startProcess() error {
	logPath := filepath.Join(s.dir, "postgres.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := s.command("postgres", s.settings()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	s.mu.Lock()
	s.proc, s.done = cmd, done
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err == nil {
			c.Close(ctx)
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("postgres exited at start: %s", s.logTail())
		case <-ctx.Done():
			s.kill()
			return fmt.Errorf("postgres did not accept connections within 60 s (%v): %s", err, s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int {
	if s.external != "" {
		u, err := url.Parse(s.external)
		if err == nil {
			if p, err := strconv.Atoi(u.Port()); err == nil {
				return p
			}
		}
		return 5432
	}
	return s.port
}

// URL is a connection URL for database db as the superuser, over TCP
// with the password.
func (s *Server) URL(db string) string {
	if s.external != "" {
		u, err := url.Parse(s.external)
		if err != nil {
			return s.external
		}
		u.Path = "/" + db
		return u.String()
	}
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", Password, s.port, db)
}

// CACertPEM is the CA that signed the server's certificate (SSL servers).
func (s *Server) CACertPEM() []byte { return s.caPEM }

// Connect opens a connection to database db; it is closed when the test ends.
func (s *Server) Connect(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL(db))
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", db, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// Exec runs statements in database db and fails the test on an error.
func (s *Server) Exec(t testing.TB, db, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL(db))
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", db, err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// QueryInt runs a query of one integer (a count, say) against the
// database at url and fails the test on an error.
func QueryInt(t testing.TB, url, q string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, q).Scan(&n); err != nil {
		t.Fatalf("pgtest: %s: %v", q, err)
	}
	return n
}

var dbSeq struct {
	sync.Mutex
	n int
}

// NewDatabase creates an empty database for this test on s and returns its
// name; it is dropped when the test ends.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	dbSeq.Lock()
	dbSeq.n++
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.n)
	dbSeq.Unlock()
	s.Exec(t, "postgres", "CREATE DATABASE "+name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			return
		}
		defer c.Close(ctx)
		// Slots of the database would keep the drop from happening.
		_, _ = c.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active", name)
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return name
}

// Restart stops the server (fast shutdown) and starts it again on the
// same port and data.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if s.external != "" {
		t.Fatalf("pgtest: cannot restart the server of QUEEN_TEST_PG_URL; use Private")
	}
	s.stop()
	if err := s.startProcess(); err != nil {
		t.Fatalf("pgtest: restart: %v", err)
	}
}

// Stop stops the server (fast shutdown); Start brings it back.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if s.external != "" {
		t.Fatalf("pgtest: cannot stop the server of QUEEN_TEST_PG_URL; use Private")
	}
	s.stop()
}

// Start starts a stopped server again.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if err := s.startProcess(); err != nil {
		t.Fatalf("pgtest: start: %v", err)
	}
}

func (s *Server) stop() {
	s.mu.Lock()
	p, done := s.proc, s.done
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.Process.Kill()
		<-done
	}
}

func (s *Server) kill() {
	s.mu.Lock()
	p, done := s.proc, s.done
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		_ = p.Process.Kill()
		<-done
	}
}

func (s *Server) removeDir() {
	if s.dir == "" {
		return
	}
	if err := os.RemoveAll(s.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "pgtest: remove %s: %v\n", s.dir, err)
	}
}
