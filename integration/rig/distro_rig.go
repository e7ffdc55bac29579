package rig

import (
	"context"
)

// DistroTrapLog is where the package-tool traps record a call (the host's /run, outside what r.tree lists).
const DistroTrapLog = "/run/package-tool-calls"

// CheckUntouched fails unless the host is as before: the paths kubeslot installs to, no ownership record, no host
// preparation files, no package tool called.
func (r *Rig) CheckUntouched(ctx context.Context, before, what string) {
	t := r.t
	t.Helper()
	if after := r.Tree(ctx); after != before {
		t.Errorf("%s changed the host:\nbefore:\n%s\nafter:\n%s", what, before, after)
	}
	for _, p := range []string{"/opt/kubeslot/ownership.json", "/opt/kubeslot/state", "/etc/sysctl.d/90-kubeslot.conf",
		"/etc/modules-load.d/kubeslot.conf", DistroTrapLog} {
		if out, err := r.H.Run(ctx, "test", "-e", p); err == nil {
			t.Errorf("%s: %s exists %s", what, p, out)
		}
	}
}
