package rig

import (
	"context"
	"errors"
	"os/exec"
	"strings"

	"github.com/kubeslot/kubeslot/units"
)

// ResetBinary is the resetter from the freshly built binaries bound into the host: a reset removes the host root, and
// with it <base>/current, so a re-run after a kill cannot run from there.
const ResetBinary = BinsPath + "/kubeslot-resetter"

// Foreign files a reset must leave alone: a .nspawn file, a unit with its enable link, a sysctl file, a drop-in of
// the node's unit, another machine's tree.
var ResetForeign = map[string]string{
	"/etc/systemd/nspawn/foreign.nspawn":                    "[Exec]\nBoot=yes\n",
	"/etc/systemd/system/foreign-test.service":              "[Service]\nType=oneshot\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n",
	"/etc/sysctl.d/99-foreign-test.conf":                    "vm.swappiness = 10\n",
	"/etc/systemd/system/systemd-nspawn@b.service.d/x.conf": "[Service]\nNice=1\n",
	"/var/lib/machines/foreign/etc/os-release":              "ID=foreign\n",
}

// ResetGone are the kubeslot artifacts of a bootstrapped host.
var ResetGone = []string{
	"/opt/kubeslot",
	"/var/lib/machines/a",
	"/etc/systemd/nspawn/a.nspawn",
	"/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf",
	"/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service",
	"/etc/systemd/system/multi-user.target.wants/" + units.Bootstrap,
	"/etc/systemd/system/multi-user.target.wants/" + units.Watcher,
	"/etc/systemd/system/multi-user.target.wants/kubeslot-reset.path",
	"/etc/systemd/system/" + units.Resetting,
	"/etc/systemd/system/multi-user.target.wants/" + units.Resetting,
}

// ResetByHand runs the resetter with --yes and the given environment; it returns the exit code and output.
func (r *Rig) ResetByHand(ctx context.Context, env ...string) (int, string) {
	r.t.Helper()
	args := append([]string{"env"}, env...)
	out, err := r.H.Run(ctx, append(args, ResetBinary, "--yes")...)
	return exitCodeOf(err), string(out)
}

// CheckReset: every kubeslot artifact is gone, the foreign files are intact, no node machine runs, and no kubeslot
// unit is known to systemd.
func (r *Rig) CheckReset(ctx context.Context) {
	t := r.t
	t.Helper()
	for _, p := range ResetGone {
		if out, err := r.H.Run(ctx, "test", "-e", p); err == nil {
			t.Errorf("%s still there after the reset %s", p, out)
		}
	}
	for p, c := range ResetForeign {
		if got, err := r.H.ReadFile(p); err != nil || string(got) != c {
			t.Errorf("foreign %s after the reset: %q %v", p, got, err)
		}
	}
	if out, err := r.H.Run(ctx, "systemctl", "is-enabled", "foreign-test.service"); err != nil || strings.TrimSpace(string(out)) != "enabled" {
		t.Errorf("foreign unit no longer enabled: %v %s", err, out)
	}
	r.checkConfigKept(ctx)
	out, _ := r.H.Run(ctx, "sh", "-c", "ls /etc/systemd/system | grep kubeslot; true")
	// The rig's own drop-in of the first-boot unit (rig.conf) is not kubeslot's: it stays.
	if s := strings.TrimSpace(string(out)); s != units.Bootstrap+".d" {
		t.Errorf("kubeslot entries left in /etc/systemd/system: %q", s)
	}
	out, _ = r.H.Run(ctx, "systemctl", "list-units", "--all", "--plain", "--no-legend", "systemd-nspawn@*", "kubeslot-*")
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[2] != "inactive" {
			t.Errorf("unit left active after the reset: %s", l)
		}
	}
	if out, err := r.H.Run(ctx, "machinectl", "list", "--no-legend"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("machines after the reset: %v %q", err, out)
	}
}

// checkConfigKept: the operator's configuration is still there, 0600, without the join token;
// the token's line is the bootstrap's comment (it removes the token once the node joined; the reset then finds none)
// and every other line is as LayDown wrote it.
func (r *Rig) checkConfigKept(ctx context.Context) {
	t := r.t
	t.Helper()
	got, err := r.H.ReadFile(ConfigPath)
	if err != nil {
		t.Errorf("the operator's %s was removed: %v", ConfigPath, err)
		return
	}
	if r.Token == "" || strings.Contains(string(got), r.Token) {
		t.Errorf("%s still holds the join token (or the rig has none to look for):\n%s", ConfigPath, got)
	}
	gotLines, wantLines := strings.Split(string(got), "\n"), strings.Split(r.Config("", ""), "\n")
	if len(gotLines) != len(wantLines) {
		t.Errorf("%s: %d lines after the reset, %d before:\n%s", ConfigPath, len(gotLines), len(wantLines), got)
		return
	}
	tokenLines := 0
	for i, w := range wantLines {
		switch g := gotLines[i]; {
		case strings.HasPrefix(w, "bootstrap_token"):
			tokenLines++
			if !strings.HasPrefix(g, "# bootstrap_token removed by kubeslot-bootstrap") {
				t.Errorf("%s line %d: %q, want the bootstrap's comment in the token's place", ConfigPath, i+1, g)
			}
		case g != w:
			t.Errorf("%s line %d changed by the reset: %q, was %q", ConfigPath, i+1, g, w)
		}
	}
	if tokenLines != 1 {
		t.Errorf("the rig's configuration has %d bootstrap_token lines, want 1", tokenLines)
	}
	if out, err := r.H.Run(ctx, "stat", "-c", "%a %U", ConfigPath); err != nil || strings.TrimSpace(string(out)) != "600 root" {
		t.Errorf("%s after the reset: mode and owner %q %v, want 600 root", ConfigPath, out, err)
	}
}

// exitCodeOf is the exit code of a command run in the host: 0, the process's code, or -1.
func exitCodeOf(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}
