package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Process is a started child process whose output is appended to a log
// file; it is waited for in the background.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}

	mu  sync.Mutex
	err error
}

// StartProcess writes banner as a line to logPath (created if missing,
// appended to otherwise), then starts cmd with its stdout and stderr going
// to the same file.
func StartProcess(cmd *exec.Cmd, logPath, banner string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open process log: %w", err)
	}
	fmt.Fprintln(f, banner)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitErr is the process's exit error (nil for status 0, or while running).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig and waits up to within for the exit; a process still
// running then is killed (SIGKILL), waited for, and an error says so.
func (p *Process) Signal(sig os.Signal, within time.Duration) error {
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(within):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("did not exit within %v of %s; killed", within, signalName(sig))
	}
}

// signalName is SIGTERM rather than "terminated".
func signalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if n := unix.SignalName(s); n != "" {
			return n
		}
	}
	return sig.String()
}

// Kill9 ends the process with SIGKILL, a crash, and waits for it.
func (p *Process) Kill9() {
	p.cmd.Process.Kill()
	<-p.done
}
