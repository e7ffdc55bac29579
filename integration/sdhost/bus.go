package sdhost

import (
	"context"
	"fmt"
	"os/exec"
	"path"
	"strings"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// busSocket is the host's D-Bus system bus seen from the machine. systemd's private socket (/run/systemd/private)
// would refuse us: PID 1 cannot see a peer PID from an outer pid namespace ("refusing: No data available").
func busSocket(pid int) string {
	return fmt.Sprintf("/proc/%d/root/run/dbus/system_bus_socket", pid)
}

// dialBus connects to the host's system bus, authenticates as this process's user (root) and says Hello, bounded
// by ctx; the connection does not depend on ctx (lib/systemdconn.DialBus, what the stages use).
func dialBus(ctx context.Context, socket string) (*godbus.Conn, error) {
	conn, err := systemdconn.DialBus(ctx, "unix:path="+socket)
	if err != nil {
		return nil, fmt.Errorf("bus %s: %w", socket, err)
	}
	return conn, nil
}

// Systemd connects go-systemd to the host's systemd over the host's system bus. The caller closes it.
func (h *Host) Systemd(ctx context.Context) (*sddbus.Conn, error) {
	pid := h.PID()
	if pid == 0 || !h.Running() {
		return nil, fmt.Errorf("host %s: not running", h.opts.Name)
	}
	socket := busSocket(pid)
	c, err := sddbus.NewConnection(func() (*godbus.Conn, error) { return dialBus(ctx, socket) })
	if err != nil {
		return nil, fmt.Errorf("host %s: systemd over D-Bus: %w", h.opts.Name, err)
	}
	return c, nil
}

// InstallUnit writes /etc/systemd/system/<name> inside the host and reloads systemd over D-Bus (the reply comes
// after the reload has finished).
func (h *Host) InstallUnit(ctx context.Context, name string, content []byte) error {
	return h.InstallUnits(ctx, map[string][]byte{name: content})
}

// InstallUnits writes several unit files (name -> content) and reloads once: a daemon-reload costs 0.6-1.3 s here.
func (h *Host) InstallUnits(ctx context.Context, units map[string][]byte) error {
	names := make([]string, 0, len(units))
	for name, content := range units {
		if name == "" || strings.ContainsRune(name, '/') || !strings.Contains(name, ".") {
			return fmt.Errorf("host %s: InstallUnit: bad unit name %q", h.opts.Name, name)
		}
		if err := h.WriteFile(path.Join("/etc/systemd/system", name), content, 0o644); err != nil {
			return err
		}
		names = append(names, name)
	}
	c, err := h.Systemd(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	t0 := time.Now()
	if err := c.ReloadContext(ctx); err != nil {
		return fmt.Errorf("host %s: daemon-reload after installing %v: %w", h.opts.Name, names, err)
	}
	h.log.Debug("units installed", "units", names, "reload", time.Since(t0).Round(time.Millisecond))
	return nil
}

// runEnv is the whole environment of commands run inside a host: nothing of the test's own leaks in.
var runEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"TERM=dumb", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0",
}

// Run runs args inside the host (nsenter -a: all its namespaces and its root) and returns the combined output; the
// error includes that output. The process stays in the machine's cgroup: anything that must be supervised by the
// host's systemd has to be started through it (systemctl, systemd-run).
func (h *Host) Run(ctx context.Context, args ...string) ([]byte, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("host %s: Run: no command", h.opts.Name)
	}
	if !h.Running() {
		return nil, fmt.Errorf("host %s: Run %q: not running", h.opts.Name, args)
	}
	nsenter, err := lookPath("nsenter")
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, nsenter, append([]string{"-t", fmt.Sprint(h.PID()), "-a"}, args...)...)
	cmd.Env = runEnv
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("host %s: run %q: %w; output: %s", h.opts.Name, args, err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// Journal returns `journalctl -u unit` of the host, run inside it so that both journal locations count:
// /run/log/journal (volatile) and /var/log/journal (a Persistent host's disk, including boots before a Kill).
func (h *Host) Journal(ctx context.Context, unit string) (string, error) {
	out, err := h.Run(ctx, "journalctl", "-u", unit, "--no-pager", "-q", "-o", "short-precise")
	return string(out), err
}
