package bootstrap

// Hosts that are not Debian, on the bootstrap rig: the isolated host is made an image-based one,
// as Flatcar is, inside its own root only (its overlay's upper layer and its mount namespace; the machine is not
// touched): Flatcar's os-release, no dpkg, /usr mounted read-only, and every package tool kubeslot could call
// (apt-get, dnf, rpm-ostree, ...) replaced by a trap that records the call. With a command of systemd-container
// missing, the bootstrap stops before any change, exit 78, naming the distribution, what is missing and how to
// provide it; with everything there, it bootstraps to a Ready node and calls no package tool.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostprep/distrotest"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/units"
)

// distroPackageTools are the tools a trap stands in for, first in every PATH (/usr/local/sbin).
var distroPackageTools = []string{"apt-get", "apt", "dnf", "yum", "rpm", "rpm-ostree", "zypper"}

func TestImageBasedHostOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	r := rig.NewWith(t, ctx, "distro", rig.Options{
		// Allowed to install packages: on an image-based host it still must not.
		Extra: func(*rig.Rig) string { return "\n[host]\ninstall_packages = true\n" },
	})
	sh := func(script string) string {
		t.Helper()
		out, err := r.H.Run(ctx, "sh", "-ec", script)
		if err != nil {
			t.Fatalf("%s: %v", script, err)
		}
		return string(out)
	}
	// Flatcar: its os-release in both places (/etc/os-release was Debian's link), no dpkg, traps for the
	// package tools, machinectl moved aside (missing), then /usr read-only as on an image.
	if err := r.H.WriteFile("/usr/lib/os-release", []byte(distrotest.Flatcar), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.H.WriteFile("/etc/os-release", []byte(distrotest.Flatcar), 0o644); err != nil {
		t.Fatal(err)
	}
	trap := "#!/bin/sh\necho \"$0 $*\" >>" + rig.DistroTrapLog + "\nexit 1\n"
	for _, tool := range distroPackageTools {
		if err := r.H.WriteFile("/usr/local/sbin/"+tool, []byte(trap), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sh("rm -f /usr/bin/dpkg /usr/bin/dpkg-query /usr/bin/dpkg-deb && mv /usr/bin/machinectl /usr/bin/.machinectl.hidden && " +
		"mount --bind /usr /usr && mount -o remount,bind,ro /usr")
	if out, err := r.H.Run(ctx, "touch", "/usr/bin/kubeslot-write-test"); err == nil {
		t.Fatalf("/usr is writable in the host after the read-only bind: %s", out)
	}
	if out, err := r.H.Run(ctx, "sh", "-c", "command -v dpkg-query dpkg"); err == nil {
		t.Fatalf("dpkg still found in the host: %s", out)
	}

	// 1. Preflight: the distribution, the missing command and how to provide it; nothing changed.
	before := r.Tree(ctx)
	code, out := r.Run(ctx, "--preflight", "--config="+rig.ConfigPath)
	t.Logf("preflight (exit %d):\n%s", code, out)
	for _, want := range []string{"host distribution: Flatcar Container Linux by Kinvolk 4081.2.1 (Oklo) (ID flatcar; image-based: kubeslot installs nothing here",
		"BLOCKED  software", "missing command machinectl", "systemd-sysext"} {
		if !strings.Contains(out, want) {
			t.Errorf("preflight lacks %q", want)
		}
	}
	if code == 0 {
		t.Errorf("preflight: exit 0 with a command missing")
	}

	// 2. The bootstrap by hand: exit 78 before any change, the message as designed.
	code, out = r.Run(ctx, "--config="+rig.ConfigPath)
	if code != exitcode.HostUnfit {
		t.Errorf("bootstrap with machinectl missing: exit %d, want %d:\n%s", code, exitcode.HostUnfit, rig.TailLines(out, 20))
	}
	for _, want := range []string{"host preparation cannot proceed on Flatcar Container Linux by Kinvolk 4081.2.1 (Oklo) (ID flatcar",
		"nothing was changed", "software systemd-container: missing command machinectl", "Flatcar (ID flatcar) has no package manager",
		"/etc/extensions/", "Ignition/Butane"} {
		if !strings.Contains(out, want) {
			t.Errorf("bootstrap output lacks %q:\n%s", want, rig.TailLines(out, 20))
		}
	}
	r.CheckUntouched(ctx, before, "the refused bootstrap")

	// 3. The first-boot unit: failed with 78 and not restarted (RestartPreventExitStatus), the host still untouched.
	if out, err := r.H.Run(ctx, "systemctl", "start", units.Bootstrap); err == nil {
		t.Errorf("the first-boot unit succeeded with machinectl missing: %s", out)
	}
	time.Sleep(time.Second) // a restart would show as activating (auto-restart) now
	show, _ := r.H.Run(ctx, "systemctl", "show", "-p", "ActiveState,SubState,Result,ExecMainStatus,NRestarts", units.Bootstrap)
	for _, want := range []string{"ActiveState=failed", "Result=exit-code", "ExecMainStatus=78", "NRestarts=0"} {
		if !strings.Contains(string(show), want) {
			t.Errorf("first-boot unit state lacks %s:\n%s", want, show)
		}
	}
	if j, _ := r.H.Journal(ctx, units.Bootstrap); !strings.Contains(j, "missing command machinectl") {
		t.Errorf("the unit's journal does not say what is missing:\n%s", rig.TailLines(j, 20))
	}
	r.CheckUntouched(ctx, before, "the refused first-boot unit")

	// 4. Everything present (machinectl back, /usr read-only again): the unit bootstraps to a Ready node, with no
	// package tool called.
	sh("mount -o remount,bind,rw /usr && mv /usr/bin/.machinectl.hidden /usr/bin/machinectl && mount -o remount,bind,ro /usr")
	sh("systemctl reset-failed " + units.Bootstrap)
	t0 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap unit with everything present: %v", err)
	}
	rig.Timing(t, "bootstrap on an image-based host: first-boot unit to complete", time.Since(t0))
	r.CheckComplete(ctx, t0)
	if calls, err := r.H.ReadFile(rig.DistroTrapLog); err == nil {
		t.Errorf("package tools were called on an image-based host:\n%s", calls)
	}
	j, _ := r.H.Journal(ctx, units.Bootstrap)
	logged := false
	for _, l := range strings.Split(j, "\n") {
		if strings.Contains(l, "host distribution") {
			logged = true
			for _, want := range []string{`id="flatcar"`, `family="image"`, `evidence="os-release ID=flatcar"`, `installs_packages="false"`} {
				if !strings.Contains(l, want) {
					t.Errorf("the journal's distribution line lacks %s:\n%s", want, l)
				}
			}
		}
	}
	if !logged {
		t.Errorf("the bootstrap's journal does not record the distribution:\n%s", rig.TailLines(j, 60))
	}
	rec, err := r.Record()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rec.Journal {
		if c.Kind == ownership.KindPackage {
			t.Errorf("journal holds a package on an image-based host: %+v", c)
		}
	}
	st, err := r.H.Run(ctx, "/opt/kubeslot/current/kubeslot", "status")
	t.Logf("kubeslot status:\n%s", st)
	for _, want := range []string{"Distribution:", "(ID flatcar; image-based: kubeslot installs nothing here; detected by os-release ID=flatcar)",
		"none: kubeslot installs nothing on this host"} {
		if err != nil || !strings.Contains(string(st), want) {
			t.Errorf("kubeslot status lacks %q (%v)", want, err)
		}
	}
}
