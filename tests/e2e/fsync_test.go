package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The binary refuses a durability setting it does not know, and an interval
// out of range, naming the setting; it accepts both modes.
func TestFsyncSettingsRefused(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"QUEEN_FSYNC=never", "QUEEN_FSYNC"},
		{"QUEEN_FSYNC=ALWAYS", "QUEEN_FSYNC"},
		{"QUEEN_FSYNC_INTERVAL_MS=0", "QUEEN_FSYNC_INTERVAL_MS"},
		{"QUEEN_FSYNC_INTERVAL_MS=60000", "QUEEN_FSYNC_INTERVAL_MS"},
		{"QUEEN_FSYNC_INTERVAL_MS=fast", "QUEEN_FSYNC_INTERVAL_MS"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, queenBin, "serve")
		addrs := freeAddrs(t, 2)
		cmd.Env = []string{"QUEEN_HTTP_ADDR=" + addrs[0], "QUEEN_RAFT_ADDR=" + addrs[1], "QUEEN_DATA_DIR=" + t.TempDir(), "QUEEN_FSYNC=interval", c.env}
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut {
			t.Errorf("%s: the server did not refuse to start (err %v): %s", c.env, err, out)
			continue
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%s: the error does not name %s: %s", c.env, c.want, out)
		}
	}
	for _, mode := range []string{"always", "interval"} {
		srv := startServer(t, withEnv("QUEEN_FSYNC", mode), withEnv("QUEEN_FSYNC_INTERVAL_MS", "5"))
		code, body, err := crashDo(srv, "POST", "/api/v1/push", map[string]any{"items": []map[string]any{{"queue": "fs", "payload": map[string]any{"m": mode}}}})
		if err != nil || code != 201 {
			t.Fatalf("QUEEN_FSYNC=%s: push answered %d %s %v", mode, code, body, err)
		}
	}
}
