// Package failpoint crashes the process at named points, for tests that
// kill a node in the middle of a multi-step operation (as etcd's gofail).
//
// Points are armed by the environment variable QUEEN_FAILPOINTS, read
// once at start: a comma-separated list of name=action, where action is
// "kill" (the process sends itself SIGKILL: nothing after the point runs,
// as in a crash) or "exit" (os.Exit(86): no deferred function runs). An
// unarmed point costs one map lookup. Production never sets the variable.
package failpoint

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// Env is the variable that arms failpoints.
const Env = "QUEEN_FAILPOINTS"

// ExitCode is the status of a process stopped by an "exit" point.
const ExitCode = 86

var armed = parse(os.Getenv(Env))

func parse(v string) map[string]string {
	if v == "" {
		return nil
	}
	m := map[string]string{}
	for _, part := range strings.Split(v, ",") {
		name, action, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" || (action != "kill" && action != "exit") {
			fmt.Fprintf(os.Stderr, "%s: ignoring %q: want name=kill or name=exit\n", Env, part)
			continue
		}
		m[name] = action
	}
	return m
}

// Hit crashes the process if the point name is armed.
func Hit(name string) {
	action, ok := armed[name]
	if !ok {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s: %s\n", name, action)
	if action == "kill" {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	os.Exit(ExitCode)
}
