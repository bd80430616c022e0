package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// natsServer is a running NATS server: in this process, or in a child
// process (-js-process) so that JetStream's client and server cross
// processes as queen's do.
type natsServer interface {
	ClientURL() string
	Shutdown()
	WaitForShutdown()
}

// natsInChild makes startNATSServer run the server in a child process.
var natsInChild bool

// natsChildEnv names the store directory and sync setting of a child
// started by startNATSChild: the bench binary then only serves NATS.
const natsChildEnv = "BENCH_NATS_CHILD"

// natsChild is a NATS server in a child process of this binary.
type natsChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	url    string
	exited chan struct{}
}

func (c *natsChild) ClientURL() string { return c.url }
func (c *natsChild) pid() int          { return c.cmd.Process.Pid }

// Shutdown closes the child's stdin, which ends it.
func (c *natsChild) Shutdown() { c.stdin.Close() }

func (c *natsChild) WaitForShutdown() {
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
	}
}

func startNATSChild(dir string, syncAlways bool) (*natsChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the bench binary for -js-process: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%t:%s", natsChildEnv, syncAlways, dir))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the NATS child: %w", err)
	}
	c := &natsChild{cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go func() {
		cmd.Wait()
		close(c.exited)
	}()
	if err != nil || !strings.HasPrefix(line, "nats://") {
		c.Shutdown()
		c.WaitForShutdown()
		return nil, fmt.Errorf("the NATS child did not report its URL (got %q, %v)", line, err)
	}
	c.url = strings.TrimSpace(line)
	return c, nil
}

// runNATSChild serves NATS for the parent until its stdin closes; it
// reports the client URL on stdout.
func runNATSChild(spec string) error {
	syncStr, dir, ok := strings.Cut(spec, ":")
	if !ok {
		return errors.New(natsChildEnv + " must be <sync>:<dir>")
	}
	natsInChild = false
	s, err := startNATSServer(dir, syncStr == "true")
	if err != nil {
		return err
	}
	fmt.Println(s.ClientURL())
	io.Copy(io.Discard, os.Stdin)
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}
