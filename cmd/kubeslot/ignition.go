package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ignition"
	"github.com/kubeslot/kubeslot/units"
)

// ignitionCmd prints an Ignition config that makes a fresh host bootstrap
// itself on its first boot: the bootstrap configuration, this release's
// binaries in the first release directory with <base>/current pointing at
// it, and kubeslot-bootstrap.service, enabled. Each binary is its own
// Ignition file, fetched and sha256-verified by Ignition (or embedded), so
// nothing needs unpacking before the unit runs: Ignition cannot unpack a
// tarball, and a shell step that could would be one more thing to fail.
type ignitionCmd struct {
	Config     string   `required:"" placeholder:"FILE" help:"Bootstrap configuration (TOML), validated first, laid down at /etc/kubeslot/config.toml (0600)."`
	Release    string   `required:"" placeholder:"DIR" help:"Directory holding this release's binaries (bin/ of make build, or an unpacked bundle): every kubeslot* file without a dot in its name is laid down; kubeslot-bootstrap must be one."`
	ReleaseURL string   `name:"release-url" placeholder:"URL" xor:"binaries" help:"Base URL serving the same files (URL/kubeslot-bootstrap, ...): Ignition fetches each and refuses it unless its sha256 matches the file in --release."`
	Embed      bool     `xor:"binaries" help:"Put the binaries into the config itself (gzipped; tens of MiB) instead of --release-url."`
	File       []string `name:"file" sep:"none" placeholder:"HOSTPATH=FILE" help:"Also lay down a local FILE at HOSTPATH on the host (0600), e.g. the CA the config's cluster.ca_file names. Repeatable."`
	Merge      []string `name:"merge" sep:"none" type:"existingfile" placeholder:"FILE" help:"Your own Ignition config (spec 3.3.0) for the host, merged by Ignition under this one (ignition.config.merge). Repeatable."`
	Butane     string   `name:"butane" enum:",fcos,flatcar" default:"" placeholder:"VARIANT" help:"Print a Butane document of this variant (fcos, flatcar) to merge into your own Butane file, instead of Ignition JSON."`
}

// firstRelease is the release directory a fresh host starts with; the
// upgrader alternates between blue and green (DESIGN.md, "Host layout").
const firstRelease = "blue"

// Bounds on what is read into memory.
const (
	maxConfigSize = 1 << 20   // as config.Load
	maxExtraFile  = 4 << 20   // a CA or a kubeconfig
	maxBinary     = 1 << 30   // a Go binary is tens of MiB
	elfMagic      = "\x7fELF" // every kubeslot binary is a static ELF executable
)

// binaryName matches the kubeslot executables in a release directory, and
// not the tarballs, checksums or notes that may sit next to them.
var binaryName = regexp.MustCompile(`^kubeslot(-[a-z0-9]+)*$`)

func (c ignitionCmd) Run(e *env) error {
	if c.ReleaseURL == "" && !c.Embed {
		return exitcode.UsageError(errors.New("say how the host gets the binaries: --release-url URL (fetched and verified by Ignition) or --embed"))
	}
	extras, err := parseExtraFiles(c.File)
	if err != nil {
		return exitcode.UsageError(err)
	}
	base := e.globals.HostRoot
	unit, err := units.Render(units.Bootstrap, units.Vars{Base: base})
	if err != nil {
		return exitcode.UsageError(fmt.Errorf("--host-root: %w", err))
	}

	data, err := readBounded(c.Config, maxConfigSize)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	cfg, err := config.Parse(c.Config, data)
	if err != nil {
		// As `config check`: the person fixes the file, so print the
		// errors plainly, one per line.
		fmt.Fprintln(e.io.Stderr, err)
		return cli.ErrReported
	}

	bins, err := releaseBinaries(c.Release)
	if err != nil {
		return err
	}

	b := ignition.NewBuilder()
	relDir := path.Join(base, hostroot.ReleasesDir, firstRelease)
	steps := []func() error{
		func() error { return b.Directory(base, 0o755) },
		func() error { return b.Directory(path.Join(base, hostroot.ReleasesDir), 0o755) },
		func() error { return b.Directory(relDir, 0o755) },
		// Relative, so the link stays right under a root prefix or if the
		// tree is moved.
		func() error {
			return b.Link(path.Join(base, hostroot.CurrentLink), path.Join(hostroot.ReleasesDir, firstRelease))
		},
		func() error { return b.Directory(path.Dir(units.ConfigPath), 0o755) },
		func() error { return b.File(units.ConfigPath, 0o600, ignition.Inline(data)) },
		func() error { return b.Unit(units.Bootstrap, unit, true) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	var embedded int64
	for _, bin := range bins {
		var src ignition.Source
		if c.Embed {
			content, err := readBounded(bin.local, maxBinary)
			if err != nil {
				return err
			}
			if sum := sha256.Sum256(content); hex.EncodeToString(sum[:]) != bin.sha256 {
				return fmt.Errorf("%s changed while it was read", bin.local)
			}
			src = ignition.Inline(content)
			embedded += int64(len(content))
		} else {
			u, err := url.JoinPath(c.ReleaseURL, bin.name)
			if err != nil {
				return exitcode.UsageError(fmt.Errorf("--release-url %q: %w", c.ReleaseURL, err))
			}
			if src, err = ignition.Remote(u, bin.sha256); err != nil {
				return exitcode.UsageError(fmt.Errorf("--release-url: %w", err))
			}
		}
		if err := b.File(path.Join(relDir, bin.name), 0o755, src); err != nil {
			return err
		}
	}
	for _, x := range extras {
		content, err := readBounded(x.local, maxExtraFile)
		if err != nil {
			return fmt.Errorf("--file %s=%s: %w", x.host, x.local, err)
		}
		if err := b.File(x.host, 0o600, ignition.Inline(content)); err != nil {
			return fmt.Errorf("--file %s=%s: %w", x.host, x.local, err)
		}
	}
	for _, f := range c.Merge {
		user, err := readBounded(f, maxConfigSize)
		if err != nil {
			return fmt.Errorf("--merge %s: %w", f, err)
		}
		if err := b.Merge(user); err != nil {
			return exitcode.UsageError(fmt.Errorf("--merge %s: %w", f, err))
		}
	}
	var out []byte
	if c.Butane != "" {
		out, err = b.Butane(c.Butane)
	} else {
		out, err = b.JSON()
	}
	if err != nil {
		return err
	}
	if _, err := e.io.Stdout.Write(out); err != nil {
		return err
	}
	c.report(e.io.Stderr, cfg, base, bins, extras, embedded)
	return nil
}

// report tells the person what the config does and what it leaves to them,
// on stderr so that stdout stays the config alone.
func (c ignitionCmd) report(w io.Writer, cfg *config.Config, base string, bins []releaseBinary, extras []extraFile, embedded int64) {
	names := make([]string, len(bins))
	for i, b := range bins {
		names[i] = b.name
	}
	how := "fetched from " + artifact.Redact(c.ReleaseURL) + " and verified by sha256"
	if c.Embed {
		how = fmt.Sprintf("embedded (%.1f MiB before compression)", float64(embedded)/(1<<20))
	}
	machine := cfg.Machine.Name
	if machine == "" {
		machine = "<each host's own name>"
	}
	fmt.Fprintf(w, "Ignition config (spec %s) for machine %s: %s (0600); %s into %s/%s/%s, %s; %s/%s -> %s/%s; %s, enabled.\n",
		ignition.SpecVersion, machine, units.ConfigPath, strings.Join(names, ", "), base, hostroot.ReleasesDir, firstRelease, how,
		base, hostroot.CurrentLink, hostroot.ReleasesDir, firstRelease, units.Bootstrap)
	if cfg.Cluster.BootstrapToken != "" {
		fmt.Fprintln(w, "note: the config holds the cluster join token: keep this output as private as the config file.")
	}
	given := map[string]bool{}
	for _, x := range extras {
		given[x.host] = true
	}
	for _, ref := range hostFiles(cfg) {
		if !given[ref.path] {
			fmt.Fprintf(w, "note: %s names the host file %s, which this config does not lay down: pass --file %s=LOCALFILE, or make sure the host has it.\n", ref.key, ref.path, ref.path)
		}
	}
}

type hostFile struct{ key, path string }

// hostFiles lists the host paths the bootstrap configuration refers to.
func hostFiles(cfg *config.Config) []hostFile {
	var out []hostFile
	add := func(key, p string) {
		if strings.HasPrefix(p, "/") {
			out = append(out, hostFile{key, p})
		}
	}
	add("cluster.ca_file", cfg.Cluster.CAFile)
	add("cluster.kubeconfig", cfg.Cluster.Kubeconfig)
	add("rootfs.source", cfg.RootFS.Source)
	add("artifacts.kubelet.url", cfg.Artifacts.Kubelet.URL)
	add("kubernetes.release.ca_file", cfg.Kubernetes.Release.CAFile)
	for key, a := range map[string]*config.Artifact{"artifacts.containerd.url": cfg.Artifacts.Containerd, "artifacts.runc.url": cfg.Artifacts.Runc, "artifacts.cni_plugins.url": cfg.Artifacts.CNIPlugins} {
		if a != nil {
			add(key, a.URL)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

type releaseBinary struct {
	name, local, sha256 string
}

// releaseBinaries finds the kubeslot executables in dir, checks each is an
// ELF file and hashes it.
func releaseBinaries(dir string) ([]releaseBinary, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--release: %w", err)
	}
	var bins []releaseBinary
	for _, e := range entries {
		if !binaryName.MatchString(e.Name()) {
			continue
		}
		local := filepath.Join(dir, e.Name())
		sum, err := hashELF(local)
		if err != nil {
			return nil, fmt.Errorf("--release: %w", err)
		}
		bins = append(bins, releaseBinary{name: e.Name(), local: local, sha256: sum})
	}
	found := false
	for _, b := range bins {
		found = found || b.name == "kubeslot-bootstrap"
	}
	if !found {
		return nil, fmt.Errorf("--release %s: no kubeslot-bootstrap in it (found %d kubeslot binaries): is this a release directory?", dir, len(bins))
	}
	return bins, nil
}

func hashELF(p string) (string, error) {
	f, err := hostroot.OpenInput(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s: not a regular file", p)
	}
	if fi.Size() > maxBinary {
		return "", fmt.Errorf("%s: %d bytes, more than the %d a kubeslot binary may have", p, fi.Size(), int64(maxBinary))
	}
	magic := make([]byte, len(elfMagic))
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != elfMagic {
		return "", fmt.Errorf("%s: not an ELF executable", p)
	}
	h := sha256.New()
	h.Write(magic)
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

type extraFile struct{ host, local string }

func parseExtraFiles(specs []string) ([]extraFile, error) {
	var out []extraFile
	for _, s := range specs {
		host, local, ok := strings.Cut(s, "=")
		if !ok || local == "" {
			return nil, fmt.Errorf("--file %q: want HOSTPATH=LOCALFILE", s)
		}
		if !path.IsAbs(host) || path.Clean(host) != host {
			return nil, fmt.Errorf("--file %q: host path %q: want a clean absolute path", s, host)
		}
		out = append(out, extraFile{host, local})
	}
	return out, nil
}

// readBounded reads a whole file, refusing one larger than limit.
func readBounded(p string, limit int64) ([]byte, error) {
	f, err := hostroot.OpenInput(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes; is this the right file?", p, limit)
	}
	return data, nil
}
