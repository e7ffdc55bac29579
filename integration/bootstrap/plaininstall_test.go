package bootstrap

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/units"
)

// TestPlainInstallOnRig: a fresh host installed from the release files alone, with README's commands for a plain
// host ("Installing on a plain host"), the download aside: the checksum checked, the tarball unpacked, the
// configuration installed 0600, the bootstrap run from the unpacked directory (with the rig's sandbox settings in
// its environment, as every rig run has). It installs its own release into /opt/kubeslot/releases/blue, its units
// (its own among them, enabled) and the node; the Node is Ready; the unpacked directory is not needed afterwards.
func TestPlainInstallOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	r := rig.NewWith(t, ctx, "pi", rig.Options{NoLayDown: true})
	name := "kubeslot-rig-linux-" + runtime.GOARCH
	// What the operator downloaded: the release's tarball of the binaries and its SHA256SUMS (made here from the
	// rig's build, as make release lays them out), and their configuration.
	release := "set -e; cd /root; mkdir " + name + "; cp " + rig.BinsPath + "/kubeslot* " + name + "/; tar -czf " + name +
		".tar.gz " + name + "; rm -r " + name + "; sha256sum " + name + ".tar.gz > SHA256SUMS"
	if out, err := r.H.Run(ctx, "sh", "-c", release); err != nil {
		t.Fatalf("the release files: %v\n%s", err, out)
	}
	if err := r.H.WriteFile("/root/config.toml", []byte(r.Config("", "")), 0o644); err != nil {
		t.Fatal(err)
	}
	// README's commands, in order.
	t0 := time.Now()
	for _, cmd := range []string{
		"sha256sum --ignore-missing -c SHA256SUMS",
		"tar -xzf " + name + ".tar.gz",
		"install -D -m 0600 config.toml " + units.ConfigPath,
		"env " + strings.Join(r.Env, " ") + " " + name + "/kubeslot-bootstrap --config " + units.ConfigPath,
	} {
		out, err := r.H.Run(ctx, "sh", "-c", "cd /root && "+cmd)
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, rig.TailLines(string(out), 40))
		}
	}
	rig.Timing(t, "plain install: README's commands to a complete host", time.Since(t0))
	r.CheckComplete(ctx, t0)
	if out, err := r.H.Run(ctx, "sh", "-c", "rm -r /root/"+name+" && test -x /opt/kubeslot/releases/blue/kubeslot-bootstrap && "+
		"readlink /opt/kubeslot/current && systemctl is-enabled "+units.Bootstrap); err != nil ||
		!strings.Contains(string(out), "releases/blue") || !strings.Contains(string(out), "enabled") {
		t.Errorf("after the install (the unpacked directory removed): %v\n%s", err, out)
	}
	// The unit it installed runs the installed release from now on: a complete host's run is a no-op.
	if err := r.StartUnit(ctx); err != nil {
		t.Errorf("%s after the install: %v", units.Bootstrap, err)
	}
}
