package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// launcher starts child processes from one goroutine locked to its OS thread.
//
// Children get Pdeathsig=SIGKILL so that they die with the test binary (a
// test that panics or is killed must not leave an etcd behind). The kernel
// sends that signal when the *thread* that forked the child exits, not the
// process, and the Go runtime retires idle threads; forking from a thread
// that lives exactly as long as the control plane keeps the signal for the
// case it is meant for. The goroutine never unlocks, so when it returns the
// runtime ends the thread: close is called only after every child is gone.
type launcher struct {
	reqs chan func()
	done chan struct{}
}

func newLauncher() *launcher {
	l := &launcher{reqs: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		defer close(l.done)
		for f := range l.reqs {
			f()
		}
	}()
	return l
}

// run executes f on the launcher's thread and waits for it.
func (l *launcher) run(f func()) {
	ran := make(chan struct{})
	l.reqs <- func() { f(); close(ran) }
	<-ran
}

func (l *launcher) close() {
	close(l.reqs)
	<-l.done
}

// proc is one child process whose output goes to a log file.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error // valid once exited is closed
}

// start runs bin with args in its own process group, output to logPath.
func start(l *launcher, name, logPath, bin string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	l.run(func() { err = cmd.Start() })
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: start %s: %w", name, bin, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, SIGKILL after grace (or when ctx
// ends), and waits until the process is reaped.
func (p *proc) stop(ctx context.Context, grace time.Duration) error {
	if p.hasExited() {
		return nil
	}
	pgid := p.cmd.Process.Pid // Setpgid: the group id is the leader's pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	// SIGKILL cannot be ignored; a bound anyway, so Stop can never hang
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) still running 10s after SIGKILL", p.name, pgid)
	}
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string { return logTail(p.logPath, n) }

// exitError describes an early exit, with the log's tail.
func (p *proc) exitError() error {
	return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, p.tail(30))
}

// bindClash tells whether the process died because a port was taken between
// our probe and its bind.
func (p *proc) bindClash() bool {
	b, _ := os.ReadFile(p.logPath)
	return bytes.Contains(b, []byte("address already in use"))
}

func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Port range for loopback listeners. Below Linux's ephemeral range
// (32768–60999): a port there can be taken by an outgoing connection's
// source port between the probe and the bind (seen on CI with etcd).
const (
	portMin = 20000
	portMax = 32767
)

// FreePorts returns n distinct TCP ports on 127.0.0.1 in 20000–32767 that
// were free a moment ago. Whoever binds them later may still lose a race:
// callers retry on "address already in use".
func FreePorts(n int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n && tries < 2000; tries++ {
		p := portMin + rand.IntN(portMax-portMin+1)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		held = append(held, l)
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, errors.New("no free loopback port in 20000-32767 after 2000 tries")
	}
	return ports, nil
}
