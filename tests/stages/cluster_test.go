package stages

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/httpapi"
	"github.com/queen-mq/queen/internal/testkit"
)

// server is a cluster of brokers in this process with an HTTP server on
// the leader (clients talk to the leader only: a forwarded command is not
// timed past the follower).
type server struct {
	brokers []*broker.Broker
	leader  *broker.Broker
	http    *httptest.Server
	client  *http.Client
}

func freeAddr(t testing.TB) string { return testkit.FreeAddr(t) }

// startServer opens nodes brokers (one cluster) and serves HTTP on the
// leader.
func startServer(t testing.TB, nodes int) *server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	peers := make([]cluster.Peer, nodes)
	for i := range peers {
		peers[i] = cluster.Peer{ID: fmt.Sprintf("n%d", i+1), Address: freeAddr(t)}
	}
	s := &server{}
	for i := range peers {
		cfg := cluster.Config{DataDir: t.TempDir(), NodeID: peers[i].ID, RaftAddr: peers[i].Address, Fsync: fsyncMode(t)}
		if nodes > 1 {
			cfg.Peers = peers
		}
		b, err := broker.Open(broker.Config{Cluster: cfg, Logger: log})
		if err != nil {
			t.Fatalf("open node %s: %v", peers[i].ID, err)
		}
		s.brokers = append(s.brokers, b)
	}
	t.Cleanup(func() {
		if s.http != nil {
			s.http.Close()
		}
		for _, b := range s.brokers {
			b.Close()
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for s.leader == nil {
		for _, b := range s.brokers {
			if h := b.Health(); h.Leader && h.Ready {
				s.leader = b
			}
		}
		if s.leader == nil {
			if time.Now().After(deadline) {
				t.Fatalf("no leader among %d nodes after 20 s", nodes)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	s.http = httptest.NewServer(httpapi.New(s.leader, httpapi.Config{Logger: log}))
	s.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}, Timeout: 60 * time.Second}
	return s
}

// fsyncMode is QUEEN_STAGES_FSYNC (always, the default, or interval).
func fsyncMode(t testing.TB) cluster.FsyncMode {
	m, err := cluster.ParseFsyncMode(os.Getenv("QUEEN_STAGES_FSYNC"))
	if err != nil {
		t.Fatalf("QUEEN_STAGES_FSYNC: %v", err)
	}
	return m
}
