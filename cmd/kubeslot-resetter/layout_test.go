package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// TestNewerLayoutRefused: a reset of a host laid out by a newer release is
// refused with exit 78 unless --force, which goes past the check.
func TestNewerLayoutRefused(t *testing.T) {
	clitest.NewerLayout(t, name, run, "--yes")
	clitest.NewerLayout(t, name, run, "--dry-run")

	clitest.NoBus(t)
	prefix := t.TempDir()
	base := filepath.Join(prefix, "opt/kubeslot")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, hostroot.LayoutFile), []byte(strconv.Itoa(hostroot.LayoutVersion+1)), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs := clitest.Call(run, "", "--force", "--dry-run", "--root-prefix", prefix, "--host-root", "/opt/kubeslot")
	if code == exitcode.HostUnfit || !strings.Contains(errs, "does not understand") {
		t.Errorf("--force --dry-run on a newer layout: exit %d, stderr %q; want past the check, with a warning", code, errs)
	}
}
