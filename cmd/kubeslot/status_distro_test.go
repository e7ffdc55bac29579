package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// status says which distribution host preparation detects, and that
// nothing was installed on an image-based host; on an apt host it lists the
// packages kubeslot's journal says it installed.
func TestStatusDistribution(t *testing.T) {
	prefix, root := installed(t)
	write := func(p, content string, mode os.FileMode) {
		t.Helper()
		local := filepath.Join(prefix, p)
		if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(local, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("/etc/os-release", "NAME=\"Flatcar Container Linux by Kinvolk\"\nID=flatcar\nID_LIKE=coreos\nVERSION_ID=4081.2.1\n", 0o644)
	code, out, errs := clitest.Call(run, "", "--root-prefix", prefix, "status")
	if code != exitcode.OK {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"Distribution:", "Flatcar Container Linux by Kinvolk (ID flatcar; image-based", "Host packages:", "none: kubeslot installs nothing on this host"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	// A Debian host where the journal holds a package kubeslot installed.
	write("/etc/os-release", "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n", 0o644)
	write("/usr/bin/dpkg-query", "#!/bin/sh\n", 0o755)
	write("/usr/bin/apt-get", "#!/bin/sh\n", 0o755)
	rec, err := ownership.Load(root)
	if err != nil || rec == nil {
		t.Fatal(rec, err)
	}
	if err := rec.Record(root, ownership.Change{Kind: ownership.KindPackage, Name: "systemd-container", Prior: ownership.Prior{State: ownership.PriorAbsent}}); err != nil {
		t.Fatal(err)
	}
	code, out, _ = clitest.Call(run, "", "--root-prefix", prefix, "status", "-o", "json")
	var st status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != exitcode.OK {
		t.Fatalf("json: exit %d, %v\n%s", code, err, out)
	}
	if st.Distro == nil || st.Distro.Family != hostprep.FamilyApt || st.Distro.ID != "debian" || !st.Distro.InstallsPackages ||
		len(st.Distro.PackagesInstalled) != 1 || st.Distro.PackagesInstalled[0] != "systemd-container" {
		t.Errorf("json distro: %+v", st.Distro)
	}
	if !strings.Contains(out, `"family": "apt"`) || !strings.Contains(out, `"packagesInstalled": [`) {
		t.Errorf("json field names:\n%s", out)
	}
}
