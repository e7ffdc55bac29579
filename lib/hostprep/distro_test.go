package hostprep

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostprep/distrotest"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// distroHost is a host root with os-release content (none when empty),
// the commands named (stand-in executables) and the markers.
func distroHost(t *testing.T, osRelease string, commands []string, ostree bool) *hostroot.Root {
	t.Helper()
	root := testkit.Root(t)
	mkdir(t, root, "/usr/lib")
	mkdir(t, root, "/usr/bin")
	mkdir(t, root, "/etc")
	if osRelease != "" {
		// As on Fedora, Flatcar and Debian: /etc/os-release links to the
		// file in /usr (an absolute link: resolved inside the root).
		writeHostFile(t, root, OSReleaseFileUsr, osRelease, 0o644)
		if err := os.Symlink("/usr/lib/os-release", local(t, root, OSReleaseFile)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range commands {
		writeHostFile(t, root, "/usr/bin/"+c, "#!/bin/sh\nexit 0\n", 0o755)
	}
	if ostree {
		mkdir(t, root, "/run")
		writeHostFile(t, root, OstreeBootedFile, "", 0o644)
	}
	return root
}

var (
	aptTools = []string{"dpkg-query", "apt-get"}
	dnfTools = []string{"rpm", "dnf"}
)

func TestDetectDistro(t *testing.T) {
	cases := []struct {
		name      string
		osRelease string
		commands  []string
		ostree    bool
		roUsr     bool
		family    Family
		id        string
		evidence  string
	}{
		{"debian 12", distrotest.Debian12, aptTools, false, false, FamilyApt, "debian", "ID=debian"},
		{"ubuntu 24.04", distrotest.Ubuntu2404, aptTools, false, false, FamilyApt, "ubuntu", "ID=ubuntu"},
		{"linux mint (ID_LIKE)", distrotest.Mint, aptTools, false, false, FamilyApt, "linuxmint", "ID_LIKE=ubuntu"},
		{"fedora 41", distrotest.Fedora41, dnfTools, false, false, FamilyDNF, "fedora", "ID=fedora"},
		{"rhel 9", distrotest.RHEL9, dnfTools, false, false, FamilyDNF, "rhel", "ID=rhel"},
		{"centos stream 9", distrotest.CentOSStream9, dnfTools, false, false, FamilyDNF, "centos", "ID=centos"},
		{"rocky 9", distrotest.Rocky9, dnfTools, false, false, FamilyDNF, "rocky", "ID=rocky"},
		{"alma 9", distrotest.Alma9, dnfTools, false, false, FamilyDNF, "almalinux", "ID=almalinux"},
		{"amazon linux 2023 (ID_LIKE fedora)", distrotest.Amazon2023, dnfTools, false, false, FamilyDNF, "amzn", "ID_LIKE=fedora"},
		// yum only: no dnf, so no guess.
		{"amazon linux 2 without dnf", distrotest.Amazon2, []string{"rpm", "yum"}, false, false, FamilyUnknown, "amzn", "ID_LIKE=centos, but dnf not found"},
		{"fedora coreos booted", distrotest.FCOS, []string{"rpm", "rpm-ostree"}, true, true, FamilyImage, "fedora", OstreeBootedFile},
		// Read from outside its boot: the variant alone says it.
		{"fedora coreos by VARIANT_ID", distrotest.FCOS, []string{"rpm"}, false, false, FamilyImage, "fedora", "VARIANT_ID=coreos"},
		{"rhel coreos", distrotest.RHCOS, []string{"rpm"}, false, false, FamilyImage, "rhcos", "ID=rhcos"},
		{"flatcar", distrotest.Flatcar, nil, false, true, FamilyImage, "flatcar", "ID=flatcar"},
		// A Debian-like os-release on a read-only /usr (an image built
		// from Debian): nothing may be installed, whatever dpkg says.
		{"debian with read-only /usr", distrotest.Debian12, aptTools, false, true, FamilyImage, "debian", "/usr is mounted read-only"},
		{"debian without dpkg", distrotest.Debian12, []string{"apt-get"}, false, false, FamilyUnknown, "debian", "dpkg-query not found"},
		{"arch", distrotest.Arch, []string{"pacman"}, false, false, FamilyUnknown, "arch", "ID=arch is not a distribution"},
		{"opensuse", distrotest.OpenSUSE, []string{"rpm", "zypper"}, false, false, FamilyUnknown, "opensuse-leap", "not a distribution kubeslot knows"},
		{"no os-release", "", aptTools, false, false, FamilyUnknown, "", "no os-release ID"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := distroHost(t, tc.osRelease, tc.commands, tc.ostree)
			setUsrReadOnly(t, tc.roUsr)
			d, err := DetectDistro(root)
			if err != nil {
				t.Fatal(err)
			}
			if d.Family != tc.family || d.ID != tc.id || !strings.Contains(d.Evidence, tc.evidence) {
				t.Errorf("DetectDistro = %+v, want family %s, ID %q, evidence containing %q", d, tc.family, tc.id, tc.evidence)
			}
			if tc.osRelease != "" && d.Name == "" {
				t.Errorf("no name read: %+v", d)
			}
			if !strings.Contains(d.String(), string(idOr(d))) {
				t.Errorf("String() = %q does not name the ID", d.String())
			}
		})
	}
}

// setUsrReadOnly stands in for the statfs of /usr for one test.
func setUsrReadOnly(t *testing.T, ro bool) {
	saved := usrReadOnly
	usrReadOnly = func(string) (bool, error) { return ro, nil }
	t.Cleanup(func() { usrReadOnly = saved })
}

func TestParseOSRelease(t *testing.T) {
	kv := parseOSRelease([]byte("# comment\nID=fedora\nNAME=\"Fedora \\\"Linux\\\"\"\nOSTREE_VERSION='41.1'\nbroken line\nID_LIKE=\"rhel  fedora\"\n =x\n"))
	want := map[string]string{"ID": "fedora", "NAME": `Fedora "Linux"`, "OSTREE_VERSION": "41.1", "ID_LIKE": "rhel  fedora"}
	for k, v := range want {
		if kv[k] != v {
			t.Errorf("%s = %q, want %q (all: %q)", k, kv[k], v, kv)
		}
	}
	if len(kv) != len(want) {
		t.Errorf("parsed %q, want only %q", kv, want)
	}
}

// The /etc/os-release link cannot lead out of the host root: an absolute
// link resolves inside it, so the machine's own os-release is never read.
func TestDetectDistroReadsInsideRoot(t *testing.T) {
	root := testkit.Root(t)
	mkdir(t, root, "/etc")
	if err := os.Symlink("../../../../../../../../etc/os-release", local(t, root, OSReleaseFile)); err == nil {
		_, err := DetectDistro(root)
		if err == nil || !errors.Is(err, hostroot.ErrEscape) {
			t.Errorf("a link climbing out of the root: %v, want ErrEscape", err)
		}
	}
}

// On an image-based host or one kubeslot knows no package manager for, a
// missing command blocks the plan before any change, no package tool is
// asked, and the error lists every missing command with how to provide it
// there, naming the os-release ID; exit code HostUnfit.
func TestSoftwareMissingWhereNothingIsInstalled(t *testing.T) {
	cases := []struct {
		name      string
		osRelease string
		commands  []string
		ostree    bool
		roUsr     bool
		want      []string // in the error
	}{
		{"flatcar", distrotest.Flatcar, nil, false, true,
			[]string{"ID flatcar", "systemd-nspawn, machinectl", "systemd-sysext", "Ignition", "image-based: kubeslot installs nothing"}},
		{"fedora coreos", distrotest.FCOS, []string{"systemd-nspawn"}, true, true,
			[]string{"ID fedora", "missing command machinectl;", "rpm-ostree install --apply-live systemd-container", "Butane"}},
		{"read-only /usr", distrotest.Debian12, aptTools, false, true,
			[]string{"ID debian", "/usr is mounted read-only", "systemd-nspawn, machinectl"}},
		{"unknown", distrotest.Arch, []string{"machinectl"}, false, false,
			[]string{"ID arch", "missing command systemd-nspawn;", "knows no package manager", "installs nothing"}},
		{"no os-release", "", nil, false, false,
			[]string{"ID none", "systemd-nspawn, machinectl"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := distroHost(t, tc.osRelease, tc.commands, tc.ostree)
			setUsrReadOnly(t, tc.roUsr)
			f := newFake(t, root)
			f.strictPackages = true
			req := Requirements{Software: []Software{SystemdContainer}, InstallPackages: true}
			plan, err := Preflight(context.Background(), root, f, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Changes()) != 0 || len(plan.Blocked()) != 1 || plan.Blocked()[0].Kind != KindSoftware {
				t.Fatalf("plan:\n%s", plan)
			}
			perr := plan.Err()
			if exitcode.Of(perr) != exitcode.HostUnfit {
				t.Errorf("exit code %d, want %d", exitcode.Of(perr), exitcode.HostUnfit)
			}
			for _, w := range tc.want {
				if !strings.Contains(perr.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, perr)
				}
			}
			rec, err := ownership.New("node-1", "abc", "v0")
			if err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, root)
			aerr := Apply(context.Background(), root, f, rec, req, nil)
			if exitcode.Of(aerr) != exitcode.HostUnfit || aerr.Error() != perr.Error() {
				t.Errorf("Apply = %v (exit %d), want the plan's error", aerr, exitcode.Of(aerr))
			}
			assertSameTree(t, before, snapshot(t, root))
			if len(rec.Journal) != 0 || len(f.mutatingCalls()) != 0 {
				t.Errorf("journal %v, calls %v", rec.Journal, f.mutatingCalls())
			}
		})
	}
}

// Everything present on an image-based or unknown host: the step is ok,
// names where it found each command, and no package tool is asked.
func TestSoftwarePresentWhereNothingIsInstalled(t *testing.T) {
	for _, osr := range []string{distrotest.Flatcar, distrotest.Arch} {
		root := distroHost(t, osr, []string{"systemd-nspawn", "machinectl"}, false)
		setUsrReadOnly(t, osr == distrotest.Flatcar)
		f := newFake(t, root)
		f.strictPackages = true
		plan, err := Preflight(context.Background(), root, f, Requirements{Software: []Software{SystemdContainer}, InstallPackages: true})
		if err != nil {
			t.Fatal(err)
		}
		if plan.Err() != nil || len(plan.Steps) != 1 || !strings.Contains(plan.Steps[0].Action, "/usr/bin/machinectl") {
			t.Errorf("plan (%v):\n%s", plan.Err(), plan)
		}
	}
}

// dnf hosts install the Fedora package name through the same System, and
// a missing one without host.install_packages names dnf.
func TestDNFHostInstallsPackage(t *testing.T) {
	root := distroHost(t, distrotest.Rocky9, dnfTools, false)
	setUsrReadOnly(t, false)
	f := newFake(t, root)
	f.checkJournal = false
	plan, err := Preflight(context.Background(), root, f, Requirements{Software: []Software{SystemdContainer}})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Distro.Family != FamilyDNF || plan.Err() == nil || !strings.Contains(plan.Err().Error(), "dnf install systemd-container") {
		t.Errorf("without install_packages: %v\n%s", plan.Err(), plan)
	}
	rec, err := ownership.New("node-1", "abc", "v0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ownership.Save(root, rec); err != nil {
		mkdir(t, root, root.Base())
		if err := ownership.Save(root, rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := Apply(context.Background(), root, f, rec, Requirements{Software: []Software{SystemdContainer}, InstallPackages: true}, nil); err != nil {
		t.Fatal(err)
	}
	if c := f.mutatingCalls(); len(c) != 1 || c[0] != "install systemd-container" {
		t.Errorf("calls %v", c)
	}
	if _, ok := rec.Lookup(ownership.KindPackage, "systemd-container"); !ok {
		t.Errorf("install not journalled: %+v", rec.Journal)
	}
}
