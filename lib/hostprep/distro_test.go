package hostprep

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// os-release files as these distributions ship them (the fields detection
// reads, and the ones around them that a parser must skip).
const (
	osReleaseDebian12 = `PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
SUPPORT_URL="https://www.debian.org/support"
BUG_REPORT_URL="https://bugs.debian.org/"
`
	osReleaseUbuntu2404 = `PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
`
	osReleaseMint = `NAME="Linux Mint"
VERSION="22 (Wilma)"
ID=linuxmint
ID_LIKE="ubuntu debian"
PRETTY_NAME="Linux Mint 22"
VERSION_ID="22"
`
	osReleaseFedora41 = `NAME="Fedora Linux"
VERSION="41 (Server Edition)"
RELEASE_TYPE=stable
ID=fedora
VERSION_ID=41
PLATFORM_ID="platform:f41"
PRETTY_NAME="Fedora Linux 41 (Server Edition)"
ANSI_COLOR="0;38;2;60;110;180"
CPE_NAME="cpe:/o:fedoraproject:fedora:41"
DEFAULT_HOSTNAME="fedora"
VARIANT="Server Edition"
VARIANT_ID=server
`
	osReleaseFCOS = `NAME="Fedora Linux"
VERSION="41.20241215.3.0 (CoreOS)"
RELEASE_TYPE=stable
ID=fedora
VERSION_ID=41
VERSION_CODENAME=""
PLATFORM_ID="platform:f41"
PRETTY_NAME="Fedora CoreOS 41.20241215.3.0"
ANSI_COLOR="0;38;2;60;110;180"
LOGO=fedora-logo-icon
CPE_NAME="cpe:/o:fedoraproject:fedora:41"
HOME_URL="https://getfedora.org/coreos/"
VARIANT="CoreOS"
VARIANT_ID=coreos
OSTREE_VERSION='41.20241215.3.0'
`
	osReleaseRHEL9 = `NAME="Red Hat Enterprise Linux"
VERSION="9.5 (Plow)"
ID="rhel"
ID_LIKE="fedora"
VERSION_ID="9.5"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Red Hat Enterprise Linux 9.5 (Plow)"
ANSI_COLOR="0;31"
LOGO="fedora-logo-icon"
CPE_NAME="cpe:/o:redhat:enterprise_linux:9::baseos"
`
	osReleaseCentOSStream9 = `NAME="CentOS Stream"
VERSION="9"
ID="centos"
ID_LIKE="rhel fedora"
VERSION_ID="9"
PLATFORM_ID="platform:el9"
PRETTY_NAME="CentOS Stream 9"
`
	osReleaseRocky9 = `NAME="Rocky Linux"
VERSION="9.5 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.5"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Rocky Linux 9.5 (Blue Onyx)"
`
	osReleaseAlma9 = `NAME="AlmaLinux"
VERSION="9.5 (Teal Serval)"
ID="almalinux"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.5"
PLATFORM_ID="platform:el9"
PRETTY_NAME="AlmaLinux 9.5 (Teal Serval)"
`
	osReleaseAmazon2023 = `NAME="Amazon Linux"
VERSION="2023"
ID="amzn"
ID_LIKE="fedora"
VERSION_ID="2023"
PLATFORM_ID="platform:al2023"
PRETTY_NAME="Amazon Linux 2023.6.20241212"
`
	osReleaseAmazon2 = `NAME="Amazon Linux"
VERSION="2"
ID="amzn"
ID_LIKE="centos rhel fedora"
VERSION_ID="2"
PRETTY_NAME="Amazon Linux 2"
`
	osReleaseFlatcar = `NAME="Flatcar Container Linux by Kinvolk"
ID=flatcar
ID_LIKE=coreos
VERSION=4081.2.1
VERSION_ID=4081.2.1
BUILD_ID=2024-12-12-0034
SYSEXT_LEVEL=1.0
PRETTY_NAME="Flatcar Container Linux by Kinvolk 4081.2.1 (Oklo)"
ANSI_COLOR="38;5;75"
HOME_URL="https://flatcar.org/"
`
	osReleaseRHCOS = `NAME="Red Hat Enterprise Linux CoreOS"
ID="rhcos"
ID_LIKE="rhel fedora"
VERSION="417.94.202412120651-0"
VERSION_ID="4.17"
VARIANT="CoreOS"
VARIANT_ID=coreos
PRETTY_NAME="Red Hat Enterprise Linux CoreOS 417.94.202412120651-0"
`
	osReleaseArch = `NAME="Arch Linux"
PRETTY_NAME="Arch Linux"
ID=arch
BUILD_ID=rolling
ANSI_COLOR="38;2;23;147;209"
`
	osReleaseOpenSUSE = `NAME="openSUSE Leap"
VERSION="15.6"
ID="opensuse-leap"
ID_LIKE="suse opensuse"
VERSION_ID="15.6"
PRETTY_NAME="openSUSE Leap 15.6"
`
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
		{"debian 12", osReleaseDebian12, aptTools, false, false, FamilyApt, "debian", "ID=debian"},
		{"ubuntu 24.04", osReleaseUbuntu2404, aptTools, false, false, FamilyApt, "ubuntu", "ID=ubuntu"},
		{"linux mint (ID_LIKE)", osReleaseMint, aptTools, false, false, FamilyApt, "linuxmint", "ID_LIKE=ubuntu"},
		{"fedora 41", osReleaseFedora41, dnfTools, false, false, FamilyDNF, "fedora", "ID=fedora"},
		{"rhel 9", osReleaseRHEL9, dnfTools, false, false, FamilyDNF, "rhel", "ID=rhel"},
		{"centos stream 9", osReleaseCentOSStream9, dnfTools, false, false, FamilyDNF, "centos", "ID=centos"},
		{"rocky 9", osReleaseRocky9, dnfTools, false, false, FamilyDNF, "rocky", "ID=rocky"},
		{"alma 9", osReleaseAlma9, dnfTools, false, false, FamilyDNF, "almalinux", "ID=almalinux"},
		{"amazon linux 2023 (ID_LIKE fedora)", osReleaseAmazon2023, dnfTools, false, false, FamilyDNF, "amzn", "ID_LIKE=fedora"},
		// yum only: no dnf, so no guess.
		{"amazon linux 2 without dnf", osReleaseAmazon2, []string{"rpm", "yum"}, false, false, FamilyUnknown, "amzn", "ID_LIKE=centos, but dnf not found"},
		{"fedora coreos booted", osReleaseFCOS, []string{"rpm", "rpm-ostree"}, true, true, FamilyImage, "fedora", OstreeBootedFile},
		// Read from outside its boot: the variant alone says it.
		{"fedora coreos by VARIANT_ID", osReleaseFCOS, []string{"rpm"}, false, false, FamilyImage, "fedora", "VARIANT_ID=coreos"},
		{"rhel coreos", osReleaseRHCOS, []string{"rpm"}, false, false, FamilyImage, "rhcos", "ID=rhcos"},
		{"flatcar", osReleaseFlatcar, nil, false, true, FamilyImage, "flatcar", "ID=flatcar"},
		// A Debian-like os-release on a read-only /usr (an image built
		// from Debian): nothing may be installed, whatever dpkg says.
		{"debian with read-only /usr", osReleaseDebian12, aptTools, false, true, FamilyImage, "debian", "/usr is mounted read-only"},
		{"debian without dpkg", osReleaseDebian12, []string{"apt-get"}, false, false, FamilyUnknown, "debian", "dpkg-query not found"},
		{"arch", osReleaseArch, []string{"pacman"}, false, false, FamilyUnknown, "arch", "ID=arch is not a distribution"},
		{"opensuse", osReleaseOpenSUSE, []string{"rpm", "zypper"}, false, false, FamilyUnknown, "opensuse-leap", "not a distribution kubeslot knows"},
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
		{"flatcar", osReleaseFlatcar, nil, false, true,
			[]string{"ID flatcar", "systemd-nspawn, machinectl", "systemd-sysext", "Ignition", "image-based: kubeslot installs nothing"}},
		{"fedora coreos", osReleaseFCOS, []string{"systemd-nspawn"}, true, true,
			[]string{"ID fedora", "missing command machinectl;", "rpm-ostree install --apply-live systemd-container", "Butane"}},
		{"read-only /usr", osReleaseDebian12, aptTools, false, true,
			[]string{"ID debian", "/usr is mounted read-only", "systemd-nspawn, machinectl"}},
		{"unknown", osReleaseArch, []string{"machinectl"}, false, false,
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
	for _, osr := range []string{osReleaseFlatcar, osReleaseArch} {
		root := distroHost(t, osr, []string{"systemd-nspawn", "machinectl"}, false)
		setUsrReadOnly(t, osr == osReleaseFlatcar)
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
	root := distroHost(t, osReleaseRocky9, dnfTools, false)
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
