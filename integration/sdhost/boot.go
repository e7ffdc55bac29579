package sdhost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	godbus "github.com/godbus/dbus/v5"
)

// instance is one boot of a host: the unshare process (our child) and the host's PID 1 (unshare's child).
type instance struct {
	unshare *exec.Cmd
	pid     int
	proc    *os.Process // PID 1 through a pidfd: signals can never hit a recycled PID
	done    chan struct{}
}

func (in *instance) exited() bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to PID 1 (the kernel then kills the whole pid namespace) and waits until unshare has reaped it,
// that is, until the namespaces are gone.
func (in *instance) kill(bound time.Duration) error {
	if in.exited() {
		return nil
	}
	if err := in.proc.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGKILL to pid %d: %w", in.pid, err)
	}
	select {
	case <-in.done:
		return nil
	case <-time.After(bound):
		return fmt.Errorf("pid %d still there %v after SIGKILL", in.pid, bound)
	}
}

func (in *instance) release() {
	if in.proc != nil {
		in.proc.Release()
	}
}

// spawner starts hosts from one OS thread that never exits. The parent-death signal of a child is tied to the thread
// that forked it, not to the process: from an ordinary goroutine, a Go runtime thread exiting would kill the host.
var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func startOnFixedThread(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.err <- r.cmd.Start()
			}
		}()
	})
	ch := make(chan error, 1)
	spawner.reqs <- spawnReq{cmd: cmd, err: ch}
	return <-ch
}

// spawnScript places the wrapper shell in the host's cgroups, then execs unshare: the cgroup namespace unshare makes
// is rooted at the cgroup its caller is in, and Go can only place a child into a cgroup2 dir at clone time, not into
// the v1 name=systemd hierarchy the hybrid layout also needs.
const spawnScript = `for d in $RIG_CGROUP_DIRS; do echo $$ > "$d/cgroup.procs" || exit 1; done; unset RIG_CGROUP_DIRS; exec "$@"`

func (h *Host) spawn(ctx context.Context) (*instance, error) {
	o := h.opts
	console, err := os.OpenFile(filepath.Join(h.state, "console.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("host %s: console log: %w", o.Name, err)
	}
	defer console.Close()
	fmt.Fprintf(console, "--- kubeslot-rig: boot %d of host %s at %s ---\n", h.bootSeen, o.Name, time.Now().Format(time.RFC3339Nano))

	args := []string{"-c", spawnScript, "rig-spawn", "unshare", "--pid", "--mount", "--uts", "--ipc", "--cgroup"}
	if !o.SharedNetwork {
		args = append(args, "--net")
	}
	args = append(args, "--propagation", "private", "--kill-child", "/bin/bash", filepath.Join(h.scripts, "host-init.sh"))
	for _, b := range o.Binds {
		mode := "rw"
		if b.ReadOnly {
			mode = "ro"
		}
		args = append(args, mode, b.Source, b.Target)
	}
	disk := ""
	if o.Persistent {
		disk = filepath.Join(h.state, "disk")
	}
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"container=" + containerEnv,
		"RIG_CGROUP_DIRS=" + strings.Join(h.cgroups, " "),
		"RIG_NAME=" + o.Name,
		"RIG_STATE=" + h.state,
		"RIG_SKEL=" + filepath.Join(h.state, "skel"),
		"RIG_DEVSKEL=" + filepath.Join(h.state, "devskel"),
		"RIG_DISK=" + disk,
		"RIG_DISK_SIZE=" + o.DiskSize,
		"RIG_CGROUP=" + h.layout,
	}
	if o.V1Controllers {
		var names []string
		for _, d := range h.v1 {
			names = append(names, d.controller)
		}
		cmd.Env = append(cmd.Env, "RIG_V1_CONTROLLERS="+strings.Join(names, " "), "RIG_KEEP_MKNOD=1")
	}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = console, console
	// Setsid: the host is nobody's terminal job. Pdeathsig: if the test binary dies, unshare dies, and its
	// --kill-child takes PID 1 and with it the whole host.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := startOnFixedThread(cmd); err != nil {
		return nil, fmt.Errorf("host %s: start unshare: %w", o.Name, err)
	}
	inst := &instance{unshare: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // unshare exits with PID 1's status or signal; nothing to learn from it
		close(inst.done)
	}()

	// PID 1 of the host is unshare's only child. Poll the kernel's children list (a file read, no fork).
	children := fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for inst.pid == 0 {
		if data, _ := os.ReadFile(children); len(data) > 0 {
			inst.pid, _ = strconv.Atoi(strings.Fields(string(data))[0])
			break
		}
		if inst.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			<-inst.done
			return nil, fmt.Errorf("host %s: unshare made no PID 1 (ctx: %v): %s", o.Name, ctx.Err(), h.consoleTail())
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Pin PID 1 with a pidfd, then make sure the PID was still unshare's child when the pidfd was taken.
	proc, err := os.FindProcess(inst.pid)
	if err == nil {
		if data, _ := os.ReadFile(children); !strings.Contains(" "+string(data), " "+strconv.Itoa(inst.pid)+" ") {
			err = errors.New("PID 1 vanished at once")
		}
	}
	if err != nil {
		_ = cmd.Process.Kill()
		<-inst.done
		return nil, fmt.Errorf("host %s: pid %d: %v: %s", o.Name, inst.pid, err, h.consoleTail())
	}
	inst.proc = proc
	h.log.Debug("host spawned", "pid", inst.pid, "unshare", cmd.Process.Pid, "took", time.Since(t0).Round(time.Millisecond))
	return inst, nil
}

// waitRunning waits until the host's systemd reports running or degraded over D-Bus.
func (h *Host) waitRunning(ctx context.Context, inst *instance) error {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, h.opts.BootTimeout)
	defer cancel()
	fail := func(what string) error {
		return fmt.Errorf("host %s (pid %d): %s after %v: %s", h.opts.Name, inst.pid, what,
			time.Since(t0).Round(time.Millisecond), h.consoleTail())
	}
	// Until PID 1 has exec'd systemd it has not pivoted: /proc/PID/root is still the machine's root, whose
	// /run/dbus may hold some other bus. comm is "systemd" only after that exec.
	comm := fmt.Sprintf("/proc/%d/comm", inst.pid)
	for {
		if data, _ := os.ReadFile(comm); strings.TrimSpace(string(data)) == "systemd" {
			break
		}
		if inst.exited() {
			return fail("host-init failed")
		}
		if ctx.Err() != nil {
			return fail("systemd never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	execd := time.Since(t0)
	socket := busSocket(inst.pid)
	var conn *godbus.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	state := "no bus yet"
	var lastErr error
	for {
		if inst.exited() {
			return fail("systemd exited during boot (state " + state + ")")
		}
		if ctx.Err() != nil {
			return fail(fmt.Sprintf("boot not finished (state %q, last error %v)", state, lastErr))
		}
		if conn == nil {
			if _, err := os.Stat(socket); err == nil {
				conn, lastErr = dialBus(ctx, socket)
			}
		}
		if conn != nil {
			var v godbus.Variant
			err := conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").CallWithContext(ctx,
				"org.freedesktop.DBus.Properties.Get", 0, "org.freedesktop.systemd1.Manager", "SystemState").Store(&v)
			if err != nil {
				lastErr = err
				conn.Close()
				conn = nil
			} else if s, ok := v.Value().(string); ok {
				state = s
				if s == "running" || s == "degraded" {
					break
				}
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	attrs := []any{"pid", inst.pid, "state", state, "exec_systemd", execd.Round(time.Millisecond),
		"boot", time.Since(t0).Round(time.Millisecond)}
	if state == "degraded" {
		attrs = append(attrs, "failed_units", failedUnits(ctx, conn))
		h.log.Warn("host booted degraded", attrs...)
	} else {
		h.log.Info("host booted", attrs...)
	}
	return nil
}

// failedUnits names the failed units, for the log of a degraded boot.
func failedUnits(ctx context.Context, conn *godbus.Conn) []string {
	var units [][]any
	call := conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").CallWithContext(ctx,
		"org.freedesktop.systemd1.Manager.ListUnitsFiltered", 0, []string{"failed"})
	if call.Err != nil {
		return []string{"(" + call.Err.Error() + ")"}
	}
	if err := call.Store(&units); err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	var names []string
	for _, u := range units {
		if len(u) > 0 {
			names = append(names, fmt.Sprint(u[0]))
		}
	}
	return names
}

// lookPath finds a tool in PATH or the sbin dirs, which a non-login root shell may lack in PATH.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found", name)
}
