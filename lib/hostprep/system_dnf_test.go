package hostprep

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostprep/distrotest"
)

// stubTools puts rpm and dnf stand-ins first in PATH: rpm knows one
// installed package, "present", and says what rpm says of any other; dnf
// records its arguments. They check ExecSystem's command lines and its
// reading of rpm's answer (the rig machine has neither tool).
func stubTools(t *testing.T) (log string) {
	t.Helper()
	dir := t.TempDir()
	log = filepath.Join(dir, "calls")
	rpm := "#!/bin/sh\necho \"rpm $*\" >>" + log + "\n" +
		"if [ \"$1 $2\" = \"-q present\" ]; then echo present-1.0-1.fc41.x86_64; exit 0; fi\n" +
		"echo \"package $2 is not installed\"; exit 1\n"
	dnf := "#!/bin/sh\necho \"dnf $*\" >>" + log + "\nexit 0\n"
	for name, body := range map[string]string{"rpm": rpm, "dnf": dnf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return log
}

func calls(t *testing.T, log string) string {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

func TestExecSystemDNF(t *testing.T) {
	log := stubTools(t)
	setUsrReadOnly(t, false)
	sys := ExecSystem{Root: distroHost(t, distrotest.Rocky9, dnfTools, false), AllowPrefix: true}
	ctx := context.Background()
	if ok, err := sys.PackageInstalled(ctx, "present"); !ok || err != nil {
		t.Errorf("present: %v %v", ok, err)
	}
	if ok, err := sys.PackageInstalled(ctx, "systemd-container"); ok || err != nil {
		t.Errorf("absent: %v %v", ok, err)
	}
	if err := sys.InstallPackages(ctx, "systemd-container"); err != nil {
		t.Fatal(err)
	}
	if err := sys.RemovePackages(ctx, "systemd-container"); err != nil {
		t.Fatal(err)
	}
	want := "rpm -q present\nrpm -q systemd-container\n" +
		"dnf install -y -q --setopt=install_weak_deps=False --setopt=clean_requirements_on_remove=False systemd-container\n" +
		"dnf remove -y -q --setopt=install_weak_deps=False --setopt=clean_requirements_on_remove=False systemd-container\n"
	if got := calls(t, log); got != want {
		t.Errorf("commands:\n%s\nwant:\n%s", got, want)
	}
	if err := sys.InstallPackages(ctx, "-x"); err == nil || !strings.Contains(err.Error(), "not an RPM package name") {
		t.Errorf("an option as a package name: %v", err)
	}
}

// On an image-based host ExecSystem runs no package tool at all, even if
// one were on the PATH.
func TestExecSystemRefusesPackagesOnImageHost(t *testing.T) {
	log := stubTools(t)
	setUsrReadOnly(t, true)
	sys := ExecSystem{Root: distroHost(t, distrotest.FCOS, []string{"rpm", "rpm-ostree"}, true), AllowPrefix: true}
	ctx := context.Background()
	if _, err := sys.PackageInstalled(ctx, "systemd-container"); err == nil || !strings.Contains(err.Error(), "runs no package tool here") {
		t.Errorf("PackageInstalled: %v", err)
	}
	if err := sys.InstallPackages(ctx, "systemd-container"); err == nil {
		t.Error("InstallPackages ran on an image-based host")
	}
	if got := calls(t, log); got != "" {
		t.Errorf("package tools called: %s", got)
	}
}
