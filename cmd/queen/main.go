// Command queen is the broker: `queen serve` (the default) starts a node on
// its embedded storage. Settings come from flags or QUEEN_* environment
// variables; flags win.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // served only on QUEEN_PPROF_ADDR
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/queen-mq/queen/internal/auth"
	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/certreload"
	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/connector"
	"github.com/queen-mq/queen/internal/httpapi"
)

func main() {
	args := os.Args[1:]
	verb := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		verb, args = args[0], args[1:]
	} else if len(args) > 0 {
		// Top-level flags of their own; anything else goes to serve.
		switch args[0] {
		case "-h", "-help", "--help":
			verb = "help"
		case "-version", "--version":
			verb = "version"
		}
	}
	var err error
	switch verb {
	case "serve":
		err = serve(args)
	case "dev-cluster":
		err = devCluster(args) // devcluster.go
	case "version":
		fmt.Println("queen", httpapi.Version)
	case "help":
		usage(os.Stdout)
	default:
		fmt.Fprintf(os.Stderr, "queen: unknown command %q\n\n", verb)
		usage(os.Stderr)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "queen:", err)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `queen: a partitioned, replicated message broker (one binary, embedded storage).

usage: queen <command> [flags]

commands:
  serve          start a node (the default when no command is given)
  dev-cluster    three local nodes on one machine, for trying failover
                 (-data DIR, -base-port N: HTTP on N, N+10, N+20; raft one above each)
  version        print the version (also: queen --version)
  help           this text (also: queen --help)

Run "queen serve -h" or "queen dev-cluster -h" for a command's flags. Every
flag of serve has a QUEEN_* environment variable (docs/configuration.md).
`)
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func envInt(name string, def int64) (int64, error) {
	v := env(name, "")
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: want an integer", name, v)
	}
	return n, nil
}

func envDuration(name string, def time.Duration) (time.Duration, error) {
	v := env(name, "")
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: want a duration such as 30s", name, v)
	}
	return d, nil
}

// parsePeers reads "id=host:port,id=host:port".
func parsePeers(s string) ([]cluster.Peer, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []cluster.Peer
	for _, part := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("QUEEN_PEERS entry %q: want id=host:port", part)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("QUEEN_PEERS entry %q: %w", part, err)
		}
		out = append(out, cluster.Peer{ID: id, Address: addr})
	}
	return out, nil
}

func serve(args []string) error {
	// The state machine's record caches are a large, long-lived heap; with
	// Go's default (GOGC=100) collection took 10-15% of the CPU under load.
	// GOGC in the environment still decides when it is set.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	httpAddr := fs.String("http-addr", env("QUEEN_HTTP_ADDR", ":6632"), "HTTP listen address (QUEEN_HTTP_ADDR)")
	dataDir := fs.String("data-dir", env("QUEEN_DATA_DIR", "./data"), "data directory (QUEEN_DATA_DIR)")
	nodeID := fs.String("node-id", env("QUEEN_NODE_ID", ""), "node id; default: generated once and kept in the data directory (QUEEN_NODE_ID)")
	raftAddr := fs.String("raft-addr", env("QUEEN_RAFT_ADDR", "127.0.0.1:6633"), "raft listen address (QUEEN_RAFT_ADDR)")
	advertise := fs.String("raft-advertise", env("QUEEN_RAFT_ADVERTISE", ""), "raft address other nodes dial; default: raft-addr (QUEEN_RAFT_ADVERTISE)")
	peers := fs.String("peers", env("QUEEN_PEERS", ""), "initial voters id=host:port,... bootstrapping a new cluster once (QUEEN_PEERS)")
	join := fs.String("join", env("QUEEN_JOIN", ""), "HTTP address of any member of a running cluster: a new node asks it to be added as a voter (QUEEN_JOIN; an operator token in QUEEN_JOIN_TOKEN when auth is on); see docs/cluster.md")
	peerCert := fs.String("peer-tls-cert-file", env("QUEEN_PEER_TLS_CERT_FILE", ""), "`path` of this node's PEM certificate for mutual TLS on the raft port, signed by the peer CA (QUEEN_PEER_TLS_CERT_FILE); see docs/cluster.md")
	peerKey := fs.String("peer-tls-key-file", env("QUEEN_PEER_TLS_KEY_FILE", ""), "`path` of the PEM key of the peer certificate (QUEEN_PEER_TLS_KEY_FILE)")
	peerCA := fs.String("peer-tls-ca-file", env("QUEEN_PEER_TLS_CA_FILE", ""), "`path` of the PEM certificate of the CA that signs every node's peer certificate (QUEEN_PEER_TLS_CA_FILE). The shared cluster key is read from QUEEN_CLUSTER_KEY only, never a flag")
	subMode := fs.String("default-subscription-mode", env("QUEEN_DEFAULT_SUBSCRIPTION_MODE", "new"), "where a new named group starts: new or all (QUEEN_DEFAULT_SUBSCRIPTION_MODE)")
	logLevel := fs.String("log-level", env("QUEEN_LOG_LEVEL", "info"), "debug, info, warn or error (QUEEN_LOG_LEVEL)")
	tokensFile := fs.String("tokens-file", env("QUEEN_TOKENS_FILE", ""), "`path` of a tokens file (lines of: sha256-hex-of-token tenant role); turns auth on, see docs/auth.md (QUEEN_TOKENS_FILE)")
	jwtPublicKey := fs.String("jwt-public-key", env("QUEEN_JWT_PUBLIC_KEY", ""), "RS256 public `key` for JWTs: PEM text or a path; turns auth on (QUEEN_JWT_PUBLIC_KEY). The HS256 secret is read from QUEEN_JWT_SECRET only, never a flag, so it stays out of process listings")
	maxBody, err := envInt("QUEEN_MAX_BODY_BYTES", 64<<20)
	if err != nil {
		return err
	}
	fs.Int64Var(&maxBody, "max-body-bytes", maxBody, "largest request body accepted (QUEEN_MAX_BODY_BYTES)")
	maxInflight, err := envInt("QUEEN_MAX_INFLIGHT_BODY_BYTES", httpapi.DefaultMaxInflightBodyBytes)
	if err != nil {
		return err
	}
	fs.Int64Var(&maxInflight, "max-inflight-body-bytes", maxInflight, "memory all request bodies in flight may hold together; past it requests get 503 with Retry-After; at least max-body-bytes (QUEEN_MAX_INFLIGHT_BODY_BYTES)")
	bodyTimeout, err := envDuration("QUEEN_BODY_READ_TIMEOUT", httpapi.DefaultBodyReadTimeout)
	if err != nil {
		return err
	}
	fs.DurationVar(&bodyTimeout, "body-read-timeout", bodyTimeout, "time a client has to send a request body; slower requests get 408 (QUEEN_BODY_READ_TIMEOUT)")
	tlsCert := fs.String("tls-cert-file", env("QUEEN_TLS_CERT_FILE", ""), "PEM certificate `file` (chain) for HTTPS; reloaded when it changes (QUEEN_TLS_CERT_FILE, with QUEEN_TLS_KEY_FILE)")
	tlsKey := fs.String("tls-key-file", env("QUEEN_TLS_KEY_FILE", ""), "PEM private key `file` for HTTPS; reloaded when it changes (QUEEN_TLS_KEY_FILE)")
	snapThreshold, err := envInt("QUEEN_SNAPSHOT_THRESHOLD", 16384)
	if err != nil {
		return err
	}
	fs.Int64Var(&snapThreshold, "snapshot-threshold", snapThreshold, "take a snapshot once this many Raft log entries have accumulated since the last one (QUEEN_SNAPSHOT_THRESHOLD)")
	trailingLogs, err := envInt("QUEEN_SNAPSHOT_TRAILING_LOGS", 4096)
	if err != nil {
		return err
	}
	fs.Int64Var(&trailingLogs, "snapshot-trailing-logs", trailingLogs, "Raft log entries kept behind a snapshot for followers that lag a little (QUEEN_SNAPSHOT_TRAILING_LOGS)")
	snapLogBytes, err := envInt("QUEEN_SNAPSHOT_LOG_BYTES", cluster.DefaultSnapshotLogBytes)
	if err != nil {
		return err
	}
	fs.Int64Var(&snapLogBytes, "snapshot-log-bytes", snapLogBytes, "take a snapshot as soon as the Raft log entries applied since the last one hold this many bytes, 1 MiB to 1 TiB (QUEEN_SNAPSHOT_LOG_BYTES)")
	trailingBytes, err := envInt("QUEEN_SNAPSHOT_TRAILING_BYTES", cluster.DefaultTrailingLogBytes)
	if err != nil {
		return err
	}
	fs.Int64Var(&trailingBytes, "snapshot-trailing-bytes", trailingBytes, "at most this many bytes of Raft log kept behind a snapshot (with at most snapshot-trailing-logs entries), 1 MiB to 1 TiB (QUEEN_SNAPSHOT_TRAILING_BYTES)")
	snapInterval, err := envDuration("QUEEN_SNAPSHOT_INTERVAL", 30*time.Second)
	if err != nil {
		return err
	}
	fs.DurationVar(&snapInterval, "snapshot-interval", snapInterval, "how often a node checks whether a snapshot is due (QUEEN_SNAPSHOT_INTERVAL)")
	segmentBytes, err := envInt("QUEEN_RAFT_SEGMENT_BYTES", 64<<20)
	if err != nil {
		return err
	}
	fs.Int64Var(&segmentBytes, "raft-segment-bytes", segmentBytes, "size of a Raft log segment file; the log is truncated behind a snapshot a whole segment at a time (QUEEN_RAFT_SEGMENT_BYTES)")
	pgFlags := map[string]*string{}
	for _, f := range []struct{ flag, env, usage string }{
		{"pg-connectors", "QUEEN_PG_CONNECTORS", "run PostgreSQL connectors on this node: true or false (QUEEN_PG_CONNECTORS, default true)"},
		{"pg-threads", "QUEEN_PG_THREADS", "connector goroutines doing CPU work at once, 1-16 (QUEEN_PG_THREADS, default 2)"},
		{"pg-reload-ms", "QUEEN_PG_RELOAD_MS", "how often this node re-reads the connector documents, 500-60000 ms (QUEEN_PG_RELOAD_MS, default 5000)"},
		{"pg-lease-ttl-ms", "QUEEN_PG_LEASE_TTL_MS", "how long a dead source owner keeps its source, 3000-120000 ms (QUEEN_PG_LEASE_TTL_MS, default 10000)"},
		{"pg-shutdown-grace-ms", "QUEEN_PG_SHUTDOWN_GRACE_MS", "how long a SIGTERM waits for the connectors' work in flight, 0-120000 ms (QUEEN_PG_SHUTDOWN_GRACE_MS, default 10000)"},
		{"pg-allow-private-networks", "QUEEN_PG_ALLOW_PRIVATE_NETWORKS", "whether connectors may reach loopback, private and link-local addresses (QUEEN_PG_ALLOW_PRIVATE_NETWORKS, default true)"},
	} {
		pgFlags[f.env] = fs.String(f.flag, env(f.env, ""), f.usage)
	}
	fsyncMode := fs.String("fsync", env("QUEEN_FSYNC", "always"), "durability of acknowledged writes: always (fsynced before the reply) or interval (written to the OS before the reply, fsynced every fsync-interval-ms); see docs/configuration.md (QUEEN_FSYNC)")
	fsyncMS, err := envInt("QUEEN_FSYNC_INTERVAL_MS", cluster.DefaultFsyncInterval.Milliseconds())
	if err != nil {
		return err
	}
	fs.Int64Var(&fsyncMS, "fsync-interval-ms", fsyncMS, "with fsync=interval, the longest time in milliseconds between two syncs of the Raft log (QUEEN_FSYNC_INTERVAL_MS)")
	diskReserve, err := envInt("QUEEN_DISK_RESERVE_BYTES", cluster.DefaultDiskReserve)
	if err != nil {
		return err
	}
	fs.Int64Var(&diskReserve, "disk-reserve-bytes", diskReserve, "free space of the data directory's disk below which writes are refused with 507 (reads keep working) until space is freed; -1 turns the check off (QUEEN_DISK_RESERVE_BYTES)")
	memLimit := fs.String("memory-limit", env("QUEEN_MEMORY_LIMIT", ""), "memory this node may use, such as 512MiB or 2GiB (at least 128MiB): sizes Pebble's block cache and memtables and the results kept for retried requests, and sets the Go heap's soft limit (GOMEMLIMIT); off keeps Pebble's own sizes (256 MiB cache, 64 MiB memtables) and no heap limit; see docs/operations.md (QUEEN_MEMORY_LIMIT; default 128MiB)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	mem, err := memoryFromSetting(*memLimit)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		v    int64
		min  int64
	}{{"snapshot-threshold", snapThreshold, 1}, {"snapshot-trailing-logs", trailingLogs, 1}, {"raft-segment-bytes", segmentBytes, 64 << 10}} {
		if c.v < c.min {
			return fmt.Errorf("%s = %d: want at least %d", c.name, c.v, c.min)
		}
	}
	snapLogB, err := cluster.LogBytesSetting("snapshot-log-bytes (QUEEN_SNAPSHOT_LOG_BYTES)", snapLogBytes)
	if err != nil {
		return err
	}
	trailingB, err := cluster.LogBytesSetting("snapshot-trailing-bytes (QUEEN_SNAPSHOT_TRAILING_BYTES)", trailingBytes)
	if err != nil {
		return err
	}
	if maxInflight < maxBody {
		return fmt.Errorf("max-inflight-body-bytes = %d is below max-body-bytes = %d: raise QUEEN_MAX_INFLIGHT_BODY_BYTES or lower QUEEN_MAX_BODY_BYTES", maxInflight, maxBody)
	}
	if bodyTimeout < 100*time.Millisecond {
		return fmt.Errorf("body-read-timeout = %v: want at least 100ms (QUEEN_BODY_READ_TIMEOUT)", bodyTimeout)
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return fmt.Errorf("HTTPS needs both QUEEN_TLS_CERT_FILE and QUEEN_TLS_KEY_FILE (or -tls-cert-file and -tls-key-file); only one is set")
	}
	if snapInterval < 10*time.Millisecond {
		return fmt.Errorf("snapshot-interval = %v: want at least 10ms", snapInterval)
	}
	pgSettings, err := connector.ParseSettings(func(name string) string { return *pgFlags[name] })
	if err != nil {
		return err
	}
	fsync, err := cluster.ParseFsyncMode(*fsyncMode)
	if err != nil {
		return err
	}
	fsyncInterval, err := cluster.FsyncIntervalFromMS(fsyncMS)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("log level %q: %w", *logLevel, err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	goLimit := applyBudget(mem)
	arenas := "default"
	if mem.Limit > 0 {
		if n := limitMallocArenas(); n > 0 {
			arenas = strconv.Itoa(n)
		} else if v := os.Getenv("MALLOC_ARENA_MAX"); v != "" {
			arenas = v + " (MALLOC_ARENA_MAX)"
		}
	}
	peerList, err := parsePeers(*peers)
	if err != nil {
		return err
	}
	authn, err := auth.New(auth.Config{TokensFile: *tokensFile, JWTSecret: env("QUEEN_JWT_SECRET", ""), JWTPublicKey: *jwtPublicKey})
	if err != nil {
		return err
	}

	var certs *certreload.Reloader
	if *tlsCert != "" {
		if certs, err = certreload.New(*tlsCert, *tlsKey, log); err != nil {
			return err
		}
	}

	b, err := broker.Open(broker.Config{
		Cluster: cluster.Config{
			DataDir: *dataDir, NodeID: *nodeID, RaftAddr: *raftAddr, Advertise: *advertise, Peers: peerList,
			JoinURL: *join, JoinToken: os.Getenv("QUEEN_JOIN_TOKEN"),
			ClusterKey: os.Getenv("QUEEN_CLUSTER_KEY"), PeerTLSCertFile: *peerCert, PeerTLSKeyFile: *peerKey, PeerTLSCAFile: *peerCA,
			SnapshotThreshold: uint64(snapThreshold), TrailingLogs: uint64(trailingLogs),
			SnapshotLogBytes: snapLogB, TrailingLogBytes: trailingB,
			SnapshotInterval: snapInterval, WALSegmentSize: int(segmentBytes), DiskReserve: diskReserve,
			Fsync: fsync, FsyncInterval: fsyncInterval,
			CacheBytes: mem.CacheBytes, MemTableBytes: mem.MemTableBytes, DedupBytes: int(mem.DedupBytes),
		},
		DefaultSubscriptionMode: *subMode,
		EncryptionKey:           os.Getenv("QUEEN_ENCRYPTION_KEY"),
		Logger:                  log,
	})
	if err != nil {
		return err
	}
	if mem.Limit > 0 {
		// What the store was opened with, as a check that the setting took.
		cache, memtable := b.MemoryBudget()
		log.Info("memory limit", "limit", formatBytes(mem.Limit), "block_cache", formatBytes(cache),
			"memtable", formatBytes(memtable), "memtables_max", 4, "retry_results", formatBytes(mem.DedupBytes),
			"go_memory_limit", formatBytes(goLimit), "malloc_arenas", arenas)
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		b.Close()
		return fmt.Errorf("listen on %s (set QUEEN_HTTP_ADDR to a free address): %w", *httpAddr, err)
	}
	metricsToken := os.Getenv("QUEEN_METRICS_TOKEN")
	if metricsToken != "" && len(metricsToken) < 16 {
		b.Close()
		return fmt.Errorf("QUEEN_METRICS_TOKEN is %d bytes; use at least 16 random bytes (e.g. `openssl rand -hex 24`)", len(metricsToken))
	}
	connectors := connector.NewRuntime(connector.RuntimeConfig{Broker: b, Settings: pgSettings, Factories: connectorFactories(), Logger: log})
	api := httpapi.New(b, httpapi.Config{MaxBodyBytes: maxBody, MaxInflightBodyBytes: maxInflight, BodyReadTimeout: bodyTimeout, Logger: log, Auth: authn, MetricsToken: metricsToken, Connectors: connectors})
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	scheme := "http"
	if certs != nil {
		srv.TLSConfig, scheme = certs.TLSConfig(), "https"
	}
	log.Info("queen serving", scheme, ln.Addr().String(), "raft", *raftAddr, "data", *dataDir, "node", b.NodeID(), "version", httpapi.Version)
	if authn.Enabled() {
		log.Info("authentication is on", "using", authn.Describe(), "open_routes", "GET /health, GET /metrics/prometheus (without a token: only series that name no tenant)",
			"metrics_token", metricsToken != "")
		for _, w := range authn.Warnings() {
			log.Warn(w)
		}
	} else {
		log.Warn("AUTHENTICATION IS OFF: every client can read, write and delete everything (development mode, single tenant \"default\"); set QUEEN_TOKENS_FILE, QUEEN_JWT_SECRET or QUEEN_JWT_PUBLIC_KEY to turn it on")
	}

	if addr := os.Getenv("QUEEN_PPROF_ADDR"); addr != "" {
		// Profiling, opt-in, on its own address (never on the API port).
		go func() {
			log.Info("pprof serving", "addr", addr)
			if err := http.ListenAndServe(addr, http.DefaultServeMux); err != nil {
				log.Error("pprof server failed", "addr", addr, "err", err)
			}
		}()
	}
	if pgSettings.Enabled {
		log.Info("connectors on", "threads", pgSettings.Threads, "reload", pgSettings.Reload, "lease_ttl", pgSettings.LeaseTTL,
			"allow_private_networks", pgSettings.AllowPrivateNetworks)
	} else {
		log.Info("connectors off on this node (QUEEN_PG_CONNECTORS=false): they show phase disabled here and run on the other nodes")
	}
	connectors.Start()
	errc := make(chan error, 1)
	go func() {
		if certs != nil {
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	var stopped error
	select {
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String())
	case <-b.Halted():
		// The state machine cannot apply the log (a storage error, or an
		// entry of a newer version): exit, so that a supervisor restarts
		// the node, which applies the entry again from its log.
		stopped = b.HaltError()
		log.Error("exiting: this node stopped applying the log", "err", stopped)
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			connectors.Stop()
			b.Close()
			return fmt.Errorf("http server: %w", err)
		}
	}
	// Connectors stop first, while the broker still serves them: their work
	// in flight gets QUEEN_PG_SHUTDOWN_GRACE_MS, and the sources' leases are
	// given back so another node takes over at once.
	connectors.Stop()
	// Long polls answer at once; requests in flight get a short grace, then
	// connections that are still open (some never send a request) close.
	b.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
	if err := b.Close(); err != nil && stopped == nil {
		return err
	}
	if stopped != nil {
		return stopped
	}
	log.Info("stopped")
	return nil
}
