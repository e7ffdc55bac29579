package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/ignition"
	"github.com/kubeslot/kubeslot/units"
)

// fakeRelease writes a release directory: ELF-looking kubeslot binaries and
// files a release directory may also hold, which must be left out.
func fakeRelease(t *testing.T, names ...string) (dir string, sums map[string]string) {
	t.Helper()
	dir = t.TempDir()
	sums = map[string]string{}
	for _, n := range names {
		data := []byte("\x7fELF fake " + n + strings.Repeat(" padding", 10000))
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o755); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(data)
		sums[n] = hex.EncodeToString(s[:])
	}
	for n, data := range map[string]string{"kubeslot-v0.1.0-amd64.tar.gz": "\x1f\x8b", "SHA256SUMS": "x", "README": "y"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, sums
}

func writeConfig(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// decoded is an Ignition config from the command, indexed for checks.
type decoded struct {
	cfg   ignition.Config
	files map[string]ignition.File
	dirs  map[string]int
	links map[string]string
}

func decode(t *testing.T, out string) decoded {
	t.Helper()
	if err := ignition.Check([]byte(out)); err != nil {
		t.Fatalf("output fails the Ignition check: %v", err)
	}
	d := decoded{files: map[string]ignition.File{}, dirs: map[string]int{}, links: map[string]string{}}
	if err := json.Unmarshal([]byte(out), &d.cfg); err != nil {
		t.Fatal(err)
	}
	for _, f := range d.cfg.Storage.Files {
		d.files[f.Path] = f
	}
	for _, dir := range d.cfg.Storage.Directories {
		d.dirs[dir.Path] = dir.Mode
	}
	for _, l := range d.cfg.Storage.Links {
		d.links[l.Path] = l.Target
	}
	return d
}

func inline(t *testing.T, r ignition.Resource) []byte {
	t.Helper()
	b64, ok := strings.CutPrefix(r.Source, "data:;base64,")
	if !ok {
		t.Fatalf("source %.40q is not inline base64", r.Source)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	if r.Compression == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if b, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

var allBinaries = []string{"kubeslot", "kubeslot-bootstrap", "kubeslot-watcher", "kubeslot-repaver", "kubeslot-upgrader", "kubeslot-resetter"}

func TestIgnitionRemoteRelease(t *testing.T) {
	cfgData := config.Example()
	cfgFile := writeConfig(t, cfgData)
	release, sums := fakeRelease(t, allBinaries...)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := clitest.Call(run, "", "ignition", "--config", cfgFile, "--release", release,
		"--release-url", "https://mirror.example/kubeslot/v0.1.0", "--file", "/etc/kubeslot/cluster-ca.crt="+ca)
	if code != exitcode.OK {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	t.Logf("stderr:\n%s", errs)
	d := decode(t, out)

	cfgEntry, ok := d.files[units.ConfigPath]
	if !ok || cfgEntry.Mode != 0o600 || !bytes.Equal(inline(t, cfgEntry.Contents), cfgData) {
		t.Errorf("%s: present %v, mode %#o, contents equal to the file: %v", units.ConfigPath, ok, cfgEntry.Mode, ok && bytes.Equal(inline(t, cfgEntry.Contents), cfgData))
	}
	if f := d.files["/etc/kubeslot/cluster-ca.crt"]; f.Mode != 0o600 || string(inline(t, f.Contents)) != "-----BEGIN CERTIFICATE-----\n" {
		t.Errorf("--file: %+v", f)
	}
	for _, n := range allBinaries {
		f, ok := d.files["/opt/kubeslot/releases/blue/"+n]
		if !ok {
			t.Errorf("binary %s not laid down", n)
			continue
		}
		if f.Mode != 0o755 || f.Contents.Source != "https://mirror.example/kubeslot/v0.1.0/"+n || f.Contents.Verification.Hash != "sha256-"+sums[n] {
			t.Errorf("binary %s: mode %#o, contents %+v", n, f.Mode, f.Contents)
		}
	}
	// Only the binaries, the config and the CA: no tarball, README or sums.
	if len(d.files) != len(allBinaries)+2 {
		t.Errorf("%d files laid down, want %d", len(d.files), len(allBinaries)+2)
	}
	if got := d.links["/opt/kubeslot/current"]; got != "releases/blue" {
		t.Errorf("current -> %q, want releases/blue", got)
	}
	for _, dir := range []string{"/opt/kubeslot", "/opt/kubeslot/releases", "/opt/kubeslot/releases/blue", "/etc/kubeslot"} {
		if m, ok := d.dirs[dir]; !ok || m != 0o755 {
			t.Errorf("directory %s: present %v, mode %#o", dir, ok, m)
		}
	}
	want, _ := units.Render(units.Bootstrap, units.Vars{})
	us := d.cfg.Systemd.Units
	if len(us) != 1 || us[0].Name != units.Bootstrap || us[0].Enabled == nil || !*us[0].Enabled || us[0].Contents != string(want) {
		t.Errorf("units: %+v", us)
	}
	// The report goes to stderr and warns about the secret; the CA was given,
	// so no note about it; the secret itself is not echoed there.
	if !strings.Contains(errs, "join token") || strings.Contains(errs, "cluster.ca_file") || strings.Contains(errs, "0123456789abcdef") {
		t.Errorf("stderr:\n%s", errs)
	}
}

func TestIgnitionEmbedAndHostRoot(t *testing.T) {
	cfgFile := writeConfig(t, config.Example())
	release, _ := fakeRelease(t, "kubeslot-bootstrap", "kubeslot-watcher")
	code, out, errs := clitest.Call(run, "", "--host-root", "/srv/ks", "ignition", "--config", cfgFile, "--release", release, "--embed")
	if code != exitcode.OK {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	d := decode(t, out)
	for _, n := range []string{"kubeslot-bootstrap", "kubeslot-watcher"} {
		f := d.files["/srv/ks/releases/blue/"+n]
		local, _ := os.ReadFile(filepath.Join(release, n))
		if got := inline(t, f.Contents); !bytes.Equal(got, local) || f.Contents.Compression != "gzip" {
			t.Errorf("%s: embedded contents equal %v, compression %q", n, bytes.Equal(got, local), f.Contents.Compression)
		}
	}
	if d.links["/srv/ks/current"] != "releases/blue" {
		t.Errorf("links: %v", d.links)
	}
	unit := d.cfg.Systemd.Units[0].Contents
	if !strings.Contains(unit, "\nExecStart=/srv/ks/current/kubeslot-bootstrap ") || !strings.Contains(unit, "KUBESLOT_HOST_ROOT=/srv/ks\n") {
		t.Errorf("unit not rendered for /srv/ks:\n%s", unit)
	}
	if !strings.Contains(errs, "embedded") || !strings.Contains(errs, "cluster.ca_file names the host file /etc/kubeslot/cluster-ca.crt") {
		t.Errorf("stderr:\n%s", errs)
	}
}

func TestIgnitionRefuses(t *testing.T) {
	good := writeConfig(t, config.Example())
	broken := strings.Replace(string(config.Example()), `version = "1.37.2"`, `version = "latest"`, 1)
	bad := writeConfig(t, []byte(broken))
	release, _ := fakeRelease(t, allBinaries...)
	noBootstrap, _ := fakeRelease(t, "kubeslot", "kubeslot-watcher")
	notELF, _ := fakeRelease(t, "kubeslot-bootstrap")
	if err := os.WriteFile(filepath.Join(notELF, "kubeslot-watcher"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	url := "https://mirror.example/r"
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"invalid config", []string{"--config", bad, "--release", release, "--release-url", url}, exitcode.Failure, "kubernetes.version"},
		{"missing config", []string{"--config", bad + ".nope", "--release", release, "--release-url", url}, exitcode.Failure, "no such file"},
		{"no bootstrap binary", []string{"--config", good, "--release", noBootstrap, "--release-url", url}, exitcode.Failure, "no kubeslot-bootstrap"},
		{"not an executable", []string{"--config", good, "--release", notELF, "--release-url", url}, exitcode.Failure, "kubeslot-watcher: not an ELF executable"},
		{"no release dir", []string{"--config", good, "--release", release + "/nope", "--release-url", url}, exitcode.Failure, "--release"},
		{"neither url nor embed", []string{"--config", good, "--release", release}, exitcode.Usage, "--release-url URL"},
		{"both url and embed", []string{"--config", good, "--release", release, "--release-url", url, "--embed"}, exitcode.Usage, "--embed"},
		{"ftp url", []string{"--config", good, "--release", release, "--release-url", "ftp://mirror/r"}, exitcode.Usage, "http or https"},
		{"file without =", []string{"--config", good, "--release", release, "--release-url", url, "--file", "/etc/x"}, exitcode.Usage, "HOSTPATH=LOCALFILE"},
		{"file relative", []string{"--config", good, "--release", release, "--release-url", url, "--file", "etc/x=" + good}, exitcode.Usage, "absolute"},
		{"file over the config", []string{"--config", good, "--release", release, "--release-url", url, "--file", units.ConfigPath + "=" + good}, exitcode.Failure, "already a file"},
		{"file missing", []string{"--config", good, "--release", release, "--release-url", url, "--file", "/etc/x=" + good + ".nope"}, exitcode.Failure, "no such file"},
		{"bad host root", []string{"--config", good, "--release", release, "--release-url", url}, exitcode.Usage, "--host-root"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"ignition"}, c.args...)
			if c.name == "bad host root" {
				args = append([]string{"--host-root", "/opt/kube slot"}, args...)
			}
			code, out, errs := clitest.Call(run, "", args...)
			if code != c.code || !strings.Contains(errs, c.want) {
				t.Errorf("exit %d, want %d; stderr does not contain %q:\n%s", code, c.code, c.want, errs)
			}
			// (kong prints usage on stdout for a parse error; no config, though)
			if strings.Contains(out, `"ignition"`) {
				t.Errorf("a config was printed although the command failed: %.200q", out)
			}
		})
	}
}

// --merge puts the operator's own config into ignition.config.merge (a broken one is refused, exit 2); --butane
// prints the same as a Butane document of the variant.
func TestIgnitionMergeAndButane(t *testing.T) {
	cfgFile := writeConfig(t, config.Example())
	release, _ := fakeRelease(t, allBinaries...)
	dir := t.TempDir()
	user := filepath.Join(dir, "user.ign")
	if err := os.WriteFile(user, []byte(`{"ignition":{"version":"3.3.0"},"passwd":{"users":[{"name":"core","sshAuthorizedKeys":["ssh-ed25519 AAAA x"]}]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"ignition", "--config", cfgFile, "--release", release, "--release-url", "https://mirror.example/kubeslot/v0.1.0"}
	code, out, errs := clitest.Call(run, "", append(args, "--merge", user)...)
	if code != exitcode.OK || !strings.Contains(out, `"merge"`) || !strings.Contains(out, "data:") {
		t.Fatalf("--merge: exit %d\n%s\n%s", code, out, errs)
	}
	broken := filepath.Join(dir, "broken.ign")
	if err := os.WriteFile(broken, []byte(`{"ignition":{"version":"2.2.0"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := clitest.Call(run, "", append(args, "--merge", broken)...); code != exitcode.Usage || !strings.Contains(errs, "broken.ign") {
		t.Errorf("--merge of a 2.x config: exit %d\n%s", code, errs)
	}
	code, out, errs = clitest.Call(run, "", append(args, "--butane", "fcos")...)
	if code != exitcode.OK || !strings.Contains(out, "variant: fcos") || !strings.Contains(out, "/opt/kubeslot/releases/blue/kubeslot-bootstrap") ||
		!strings.Contains(out, "kubeslot-bootstrap.service") {
		t.Errorf("--butane fcos: exit %d\n%s\n%s", code, out, errs)
	}
}
