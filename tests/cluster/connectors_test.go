package cluster

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startProcClusterEnv starts len(envs) processes bootstrapping one
// cluster, node i with envs[i] added to its environment.
func startProcClusterEnv(t *testing.T, envs [][]string) *procCluster {
	t.Helper()
	c := &procCluster{t: t}
	addrs := freeAddrs(t, 2*len(envs))
	var peers []string
	for i, env := range envs {
		p := &proc{t: t, id: fmt.Sprintf("n%d", i+1), httpAddr: addrs[2*i], raftAddr: addrs[2*i+1],
			dataDir: filepath.Join(t.TempDir(), "data"), env: append([]string(nil), env...)}
		p.logPath = filepath.Join(filepath.Dir(p.dataDir), "queen.log")
		peers = append(peers, p.id+"="+p.raftAddr)
		c.procs = append(c.procs, p)
	}
	for _, p := range c.procs {
		p.env = append(p.env, "QUEEN_PEERS="+strings.Join(peers, ","))
		p.start()
	}
	t.Cleanup(func() {
		for _, p := range c.procs {
			if p.alive() {
				p.kill()
			}
		}
		if t.Failed() {
			for _, p := range c.procs {
				t.Logf("log of %s:\n%s", p.id, p.logTail())
			}
		}
	})
	waitServing(t, c.nodes(), 30*time.Second)
	return c
}

type connectorRead struct {
	Name       string `json:"name"`
	Version    uint64 `json:"version"`
	Connection struct {
		PasswordSet bool `json:"passwordSet"`
	} `json:"connection"`
	Sink *struct {
		Batch int `json:"batch"`
	} `json:"sink"`
	Status struct {
		Phase   string `json:"phase"`
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"status"`
}

// Connector documents are replicated: written through a follower, every
// node reads the same document and version, and each node's runtime loads
// it and reports its own status: disabled on the node with
// QUEEN_PG_CONNECTORS=false, unseal on the node with another key.
func TestConnectorDocumentsReplicated(t *testing.T) {
	key := strings.Repeat("5a", 32)
	other := strings.Repeat("a5", 32)
	c := startProcClusterEnv(t, [][]string{
		{"QUEEN_ENCRYPTION_KEY=" + key, "QUEEN_PG_RELOAD_MS=500"},
		{"QUEEN_ENCRYPTION_KEY=" + key, "QUEEN_PG_RELOAD_MS=500", "QUEEN_PG_CONNECTORS=false"},
		{"QUEEN_ENCRYPTION_KEY=" + other, "QUEEN_PG_RELOAD_MS=500"},
	})
	nodes := c.nodes()
	leader := waitServing(t, nodes, 30*time.Second)
	var via node
	for _, n := range nodes {
		if n.name() != leader.name() && n.name() != "n3" {
			via = n
		}
	}
	if via == nil {
		via = others(nodes, leader)[0]
	}
	body := map[string]any{"kind": "sink",
		"connection": map[string]any{"host": "pg.invalid", "database": "app", "user": "w", "password": "pw"},
		"sink":       map[string]any{"queue": "orders", "table": "public.orders_copy", "mode": "append", "batch": 250}}
	code, b, err := doT("PUT", via.base()+"/api/v1/connectors/snk", body, 10*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("PUT through %s: %d %s %v", via.name(), code, b, err)
	}
	var put connectorRead
	json.Unmarshal(b, &put)
	if put.Version == 0 || !put.Connection.PasswordSet || strings.Contains(string(b), `"pw"`) {
		t.Fatalf("PUT reply: %s", b)
	}
	err = checkFor(20*time.Second, 100*time.Millisecond, func() error {
		for _, n := range nodes {
			code, b, err := doT("GET", n.base()+"/api/v1/connectors/snk", nil, 5*time.Second)
			if err != nil || code != 200 {
				return fmt.Errorf("%s: %d %s %v", n.name(), code, b, err)
			}
			var r connectorRead
			json.Unmarshal(b, &r)
			if r.Version != put.Version || r.Sink == nil || r.Sink.Batch != 250 || !r.Connection.PasswordSet {
				return fmt.Errorf("%s reads %s", n.name(), b)
			}
			st := r.Status
			switch n.name() {
			case "n2":
				if st.Phase != "disabled" {
					return fmt.Errorf("n2 (connectors off) shows %+v", st)
				}
			case "n3":
				if st.Phase != "error" || st.Code != "unseal" || !strings.Contains(st.Message, "QUEEN_ENCRYPTION_KEY") {
					return fmt.Errorf("n3 (another key) shows %+v", st)
				}
			default:
				// n1 has the key: it loaded the document, and whatever its
				// sink does it is not stuck before the start or on the key.
				if st.Phase == "connecting" && strings.Contains(st.Message, "not loaded") || st.Code == "unseal" {
					return fmt.Errorf("n1 shows %+v", st)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A delete through another node is seen everywhere.
	code, b, err = doT("DELETE", leader.base()+"/api/v1/connectors/snk", nil, 10*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("DELETE: %d %s %v", code, b, err)
	}
	for _, n := range nodes {
		code, b, err := doT("GET", n.base()+"/api/v1/connectors/snk", nil, 5*time.Second)
		if err != nil || code != 404 || !strings.Contains(string(b), "connector_not_found") {
			t.Fatalf("%s after the delete: %d %s %v", n.name(), code, b, err)
		}
	}
	// The nodes stop cleanly on SIGTERM with connectors configured.
	for _, p := range c.procs {
		p.term()
	}
}
