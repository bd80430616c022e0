package pgtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestSharedServerIsLogicalAndCurrent(t *testing.T) {
	s := Shared(t)
	c := s.Connect(t, "postgres")
	ctx := context.Background()
	var wal string
	var num int
	if err := c.QueryRow(ctx, "SELECT current_setting('wal_level'), current_setting('server_version_num')::int").Scan(&wal, &num); err != nil {
		t.Fatal(err)
	}
	if wal != "logical" {
		t.Fatalf("wal_level = %q, want logical", wal)
	}
	if num < 170000 {
		t.Fatalf("server_version_num = %d, want 17 or later", num)
	}
	t.Logf("PostgreSQL %d", num)
	if want, _ := wantedMajor(); want != 0 && num/10000 != want {
		t.Fatalf("QUEEN_TEST_PG_VERSION=%d but the server is %d", want, num)
	}
	db := s.NewDatabase(t)
	s.Exec(t, db, "CREATE TABLE t (id int PRIMARY KEY)")
	s.Exec(t, db, "INSERT INTO t VALUES (1)")
}

func TestPrivateRestartKeepsData(t *testing.T) {
	if os.Getenv("QUEEN_TEST_PG_URL") != "" && !canStartServers() {
		t.Skip("QUEEN_TEST_PG_URL is set and no binaries can be had for a private server")
	}
	s := Private(t, Options{Settings: map[string]string{"max_slot_wal_keep_size": "64MB"}})
	s.Exec(t, "postgres", "CREATE TABLE kept (v text)")
	s.Exec(t, "postgres", "INSERT INTO kept VALUES ('before')")
	port := s.Port()
	s.Restart(t)
	if s.Port() != port {
		t.Fatalf("port moved from %d to %d", port, s.Port())
	}
	c := s.Connect(t, "postgres")
	var v, keep string
	if err := c.QueryRow(context.Background(), "SELECT v, current_setting('max_slot_wal_keep_size') FROM kept").Scan(&v, &keep); err != nil {
		t.Fatal(err)
	}
	if v != "before" || keep != "64MB" {
		t.Fatalf("after restart: v=%q max_slot_wal_keep_size=%q", v, keep)
	}
}

func TestSSLServerNeedsItsCA(t *testing.T) {
	s := Private(t, Options{SSL: true})
	if !strings.Contains(string(s.CACertPEM()), "BEGIN CERTIFICATE") {
		t.Fatal("no CA certificate")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := s.Connect(t, "postgres")
	var ssl bool
	if err := c.QueryRow(ctx, "SELECT current_setting('ssl')::bool").Scan(&ssl); err != nil {
		t.Fatal(err)
	}
	if !ssl {
		t.Fatal("ssl is off")
	}
}

// TestPrivateOlderServer: Options{Major: 16} starts a PostgreSQL 16 (the
// version checks' tests need one), with logical WAL like every server here.
func TestPrivateOlderServer(t *testing.T) {
	s := Private(t, Options{Major: 16})
	c := s.Connect(t, "postgres")
	var wal string
	var num int
	if err := c.QueryRow(context.Background(), "SELECT current_setting('wal_level'), current_setting('server_version_num')::int").Scan(&wal, &num); err != nil {
		t.Fatal(err)
	}
	if num/10000 != 16 || wal != "logical" {
		t.Fatalf("server_version_num %d, wal_level %q; want 16xxxx and logical", num, wal)
	}
	t.Logf("PostgreSQL %d", num)
}

func canStartServers() bool {
	m, _ := wantedMajor()
	_, err := binDir(m)
	return err == nil
}
