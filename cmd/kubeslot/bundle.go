package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

type bundleCmd struct {
	Create bundleCreateCmd `cmd:"" help:"Write a release bundle (binaries, unit templates, manifest) as a gzip tarball; prints its sha256 and path."`
}

// bundleCreateCmd writes the bundle `make bundle` ships. The release version
// flag is --release-version: --version is the global flag that prints this
// binary's version.
type bundleCreateCmd struct {
	Bins           string `default:"bin" placeholder:"DIR" help:"Directory holding the kubeslot binaries (make build writes bin/)."`
	Units          string `default:"units" placeholder:"DIR" help:"Directory holding the unit templates (*.service, *.path, ...)."`
	ReleaseVersion string `name:"release-version" placeholder:"VERSION" help:"Version stamped into the manifest (default: this kubeslot binary's version)."`
	Arch           string `placeholder:"GOARCH" help:"Architecture of the binaries (default: this kubeslot binary's)."`
	Out            string `placeholder:"FILE" help:"Bundle to write (default: dist/kubeslot-<version>-<arch>.tar.gz); replaced atomically."`
	// SourceDateEpoch is the reproducible-builds convention: a release
	// stamps its commit's time, so the same tree gives the same bytes.
	SourceDateEpoch int64 `name:"created" env:"SOURCE_DATE_EPOCH" placeholder:"UNIX-SECONDS" help:"Creation time stamped into the bundle (default: now; SOURCE_DATE_EPOCH)."`
}

func (c bundleCreateCmd) Run(e *env) error {
	version, arch := c.ReleaseVersion, c.Arch
	if version == "" {
		version = buildinfo.Version
	}
	if arch == "" {
		arch = buildinfo.Arch
	}
	// Checked before anything is written: the version goes into the file name.
	if err := bundle.CheckVersion(version); err != nil {
		return exitcode.UsageError(fmt.Errorf("--release-version: %w", err))
	}
	if err := bundle.CheckArch(arch); err != nil {
		return exitcode.UsageError(fmt.Errorf("--arch: %w", err))
	}
	out := c.Out
	if out == "" {
		out = filepath.Join("dist", fmt.Sprintf("kubeslot-%s-%s.tar.gz", version, arch))
	}
	var created time.Time
	if c.SourceDateEpoch > 0 {
		created = time.Unix(c.SourceDateEpoch, 0)
	}
	sum, err := writeBundle(out, c.Bins, c.Units, version, arch, created)
	if err != nil {
		return err
	}
	// sha256sum's format, so `sha256sum -c` and scripts can read it.
	_, err = fmt.Fprintf(e.io.Stdout, "%s  %s\n", sum, out)
	return err
}

// writeBundle writes the bundle to a temporary file next to out and renames
// it into place, so out is either the old bundle or the whole new one.
func writeBundle(out, bins, unitsDir, version, arch string, created time.Time) (sum string, err error) {
	dir := filepath.Dir(out)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(out)+".tmp-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	if _, err := bundle.Create(io.MultiWriter(tmp, h), bins, unitsDir, version, arch, created); err != nil {
		return "", fmt.Errorf("bundle %s: %w", out, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := atomicfile.Rename(tmp.Name(), out); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
