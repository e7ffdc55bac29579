package rig

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/units"
)

// upBins holds the binaries built stamped with a version, while the test that first asked for them runs.
var upBins sync.Map

func BuildRelease(t *testing.T, version string) string {
	t.Helper()
	f, loaded := upBins.LoadOrStore(version, sync.OnceValues(func() (string, error) {
		dir, err := os.MkdirTemp("", "kubeslot-up-"+version+"-")
		if err != nil {
			return "", err
		}
		cmd := exec.Command("go", "build", "-tags=kubeslot_testhooks", "-o", dir+"/",
			"-ldflags", "-X github.com/kubeslot/kubeslot/lib/buildinfo.Version="+version, "./cmd/...")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("build release %s: %v\n%s", version, err, out)
		}
		return dir, nil
	}))
	dir, err := f.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	if !loaded {
		t.Cleanup(func() {
			upBins.Delete(version)
			os.RemoveAll(dir)
		})
	}
	return dir
}

// MakeUpgradeBundle writes a bundle of the binaries in bins, stamped version, whose watcher unit gets the extra
// lines (key=value, placed in [Unit] or [Service] by key); it returns its path and sha256.
func MakeUpgradeBundle(t *testing.T, bins, version string, extra ...string) (string, string) {
	t.Helper()
	return MakeUpgradeBundleWith(t, bins, version, nil, extra...)
}

// MakeUpgradeBundleWith is MakeUpgradeBundle with more unit templates (name → content).
func MakeUpgradeBundleWith(t *testing.T, bins, version string, moreUnits map[string]string, extra ...string) (string, string) {
	t.Helper()
	udir := t.TempDir()
	for name, data := range moreUnits {
		if err := os.WriteFile(filepath.Join(udir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range units.Templates() {
		if name == units.Watcher {
			for _, l := range extra {
				// A key the template sets already is replaced there (the last assignment would win).
				key, _, _ := strings.Cut(l, "=")
				if re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `=.*$`); key != "Environment" && re.Match(data) {
					data = re.ReplaceAll(data, []byte(l))
					continue
				}
				section := "[Service]\n"
				if strings.HasPrefix(l, "StartLimit") {
					section = "[Unit]\n"
				}
				data = bytes.Replace(data, []byte(section), []byte(section+l+"\n"), 1)
			}
		}
		if err := os.WriteFile(filepath.Join(udir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Through the CLI (`kubeslot bundle create`, what `make bundle` runs): compressing ~100 MB inside this
	// race-instrumented test binary takes minutes.
	p := filepath.Join(t.TempDir(), "kubeslot-"+version+".tar.gz")
	cmd := exec.Command(filepath.Join(bins, "kubeslot"), "bundle", "create", "--bins", bins, "--units", udir,
		"--release-version", version, "--arch", buildinfo.Arch, "--out", p)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bundle create: %v\n%s", err, out)
	}
	sum, err := fileSum(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, sum
}

func fileSum(p string) (string, error) {
	out, err := exec.Command("sha256sum", p).Output()
	if err != nil {
		return "", err
	}
	return strings.Fields(string(out))[0], nil
}
