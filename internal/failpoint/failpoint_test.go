package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// TestHit runs this test binary as a child with points armed and checks
// that it dies at them, the way the env var says, and that an unarmed
// point does nothing.
func TestHit(t *testing.T) {
	if name := os.Getenv("FAILPOINT_CHILD"); name != "" {
		Hit("not-armed")
		Hit(name)
		os.Exit(0) // not reached when armed
	}
	for _, c := range []struct {
		arm, hit string
		check    func(*os.ProcessState) bool
		want     string
	}{
		{"p=exit", "p", func(s *os.ProcessState) bool { return s.ExitCode() == ExitCode }, "exit code 86"},
		{"p=kill", "p", func(s *os.ProcessState) bool {
			ws, ok := s.Sys().(syscall.WaitStatus)
			return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
		}, "killed by SIGKILL"},
		{"other=kill", "p", func(s *os.ProcessState) bool { return s.ExitCode() == 0 }, "exit code 0"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHit$")
		cmd.Env = append(os.Environ(), "FAILPOINT_CHILD="+c.hit, Env+"="+c.arm)
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if !c.check(cmd.ProcessState) {
			t.Errorf("%s=%s, hit %s: child ended with %v, want %s", Env, c.arm, c.hit, cmd.ProcessState, c.want)
		}
	}
}
