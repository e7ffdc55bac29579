// Package release is the installed agent releases in the host root: two
// release directories, <base>/releases/blue and green, each an unpacked
// bundle (manifest.json, the kubeslot* executables, units/ with the unit
// templates), and two relative links, <base>/current (the release every
// unit's ExecStart runs through) and <base>/last-good (the one to fall back
// to), each replaced atomically (a temporary link renamed over it). The
// bootstrap installs the first release into blue (Ensure); the upgrader
// unpacks the next ones into the release current does not name (Inactive).
// A host provisioned by `kubeslot ignition` may already hold a usable blue
// without a manifest; Usable accepts it and nothing is copied.
//
// Imported by the bootstrap stage and the upgrader; cmd/ binaries reach it
// through them.
package release

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/units"
)

// Binaries are the executables a complete release holds.
var Binaries = bundle.Binaries

// First is the release directory a fresh host starts with.
const First = "blue"

// Names are the two release directories.
var Names = []string{"blue", "green"}

// versionTimeout bounds one `--version` run: a static binary answers in
// milliseconds, one that hangs is not usable.
var versionTimeout = 5 * time.Second

// ErrSlow is returned (wrapped) when a binary did not answer `--version` in
// time: a busy host at boot, not a broken release. Nothing is replaced on
// it (one slow answer at boot must never remove the only
// fallback).
var ErrSlow = errors.New("did not answer in time")

// maxBinary bounds a copied binary (Go binaries are tens of MiB).
const maxBinary = 1 << 30

// Usable reports nil when <base>/current resolves to a directory holding
// every binary of Binaries, each of which runs `--version` successfully;
// otherwise an error naming what is missing or broken.
func Usable(ctx context.Context, root *hostroot.Root) error {
	dir, err := root.Path(hostroot.CurrentLink)
	if err != nil {
		return err
	}
	return checkDir(ctx, dir)
}

func checkDir(ctx context.Context, dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("release %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("release %s: not a directory", dir)
	}
	for _, name := range Binaries {
		p := filepath.Join(dir, name)
		if err := runVersion(ctx, p); err != nil {
			return fmt.Errorf("release %s: %w", dir, err)
		}
	}
	return nil
}

func runVersion(ctx context.Context, p string) error {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p, "--version")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%s --version %w (%s)", p, ErrSlow, versionTimeout)
	}
	if err != nil {
		if len(out) > 200 {
			out = out[len(out)-200:]
		}
		return fmt.Errorf("%s --version: %v (%q)", p, err, out)
	}
	return nil
}

// Ensure makes <base>/current a usable release. When it already is, it
// does nothing and returns false. Otherwise it installs the release srcDir
// (the running binary's directory) into <base>/releases/blue, staged in a
// hidden directory and renamed into place so a half-copied release is never
// visible, checks it, and points current and last-good at it; it returns
// true. A srcDir holding a manifest (an unpacked bundle) is copied as
// listed and verified against it; a plain directory of binaries gets this
// binary's unit templates in units/ and a manifest stamped with its version.
func Ensure(ctx context.Context, root *hostroot.Root, srcDir string, log *slog.Logger) (bool, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	err := Usable(ctx, root)
	if err == nil {
		return false, nil
	}
	if errors.Is(err, ErrSlow) {
		return false, fmt.Errorf("the installed release may be fine but is slow to answer; not replacing it (a later run checks again): %w", err)
	}
	// The fallback stays: when last-good is blue (the directory this would
	// replace) and blue runs, current goes back to it instead.
	if lg, lerr := LastGood(root); lerr == nil && lg == First {
		if dir, derr := Dir(root, First); derr == nil && checkDir(ctx, dir) == nil {
			log.Info("current is not usable; pointing it back at the last good release", "release", First, "reason", err.Error())
			if err := SetCurrent(root, First); err != nil {
				return false, err
			}
			return true, nil
		}
	}
	log.Info("installing this release into the host root", "from", srcDir, "reason", err.Error())
	if err := checkDir(ctx, srcDir); err != nil {
		return false, fmt.Errorf("install release from %s (the running binary's directory): %w", srcDir, err)
	}
	rels, err := root.Path(hostroot.ReleasesDir)
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(rels, 0o755); err != nil {
		return false, fmt.Errorf("install release: %w", err)
	}
	final := filepath.Join(rels, First)
	partial := filepath.Join(rels, "."+First+".partial")
	if err := os.RemoveAll(partial); err != nil {
		return false, fmt.Errorf("install release: clear %s: %w", partial, err)
	}
	if err := os.Mkdir(partial, 0o755); err != nil {
		return false, fmt.Errorf("install release: %w", err)
	}
	if err := fill(srcDir, partial); err != nil {
		os.RemoveAll(partial)
		return false, fmt.Errorf("install release: %w", err)
	}
	// A broken blue (why current was not usable) is replaced whole.
	if err := os.RemoveAll(final); err != nil {
		return false, fmt.Errorf("install release: remove the unusable %s: %w", final, err)
	}
	if err := atomicfile.Rename(partial, final); err != nil {
		return false, fmt.Errorf("install release: %w", err)
	}
	if err := checkDir(ctx, final); err != nil {
		return false, fmt.Errorf("install release: the copied release does not run: %w", err)
	}
	if err := SetCurrent(root, First); err != nil {
		return false, err
	}
	if err := SetLastGood(root, First); err != nil {
		return false, err
	}
	log.Info("release installed", "dir", root.HostPath(hostroot.ReleasesDir, First))
	return true, nil
}

// fill makes the release directory dst from srcDir: a bundle's files as its
// manifest lists them, or the binaries plus this binary's unit templates and
// a new manifest.
func fill(srcDir, dst string) error {
	if _, err := os.Lstat(filepath.Join(srcDir, bundle.ManifestName)); err == nil {
		m, err := bundle.ReadManifest(srcDir)
		if err != nil {
			return err
		}
		if err := os.Mkdir(filepath.Join(dst, bundle.UnitsDir), 0o755); err != nil {
			return err
		}
		for _, f := range append(m.Files, bundle.File{Path: bundle.ManifestName, Mode: 0o644}) {
			rel := filepath.FromSlash(f.Path)
			if err := atomicfile.CopyFile(filepath.Join(srcDir, rel), filepath.Join(dst, rel), fs.FileMode(f.Mode), maxBinary); err != nil {
				return err
			}
		}
		if err := syncDirs(dst); err != nil {
			return err
		}
		_, err = bundle.VerifyDir(dst, buildinfo.Arch)
		return err
	}
	for _, name := range Binaries {
		if err := atomicfile.CopyFile(filepath.Join(srcDir, name), filepath.Join(dst, name), 0o755, maxBinary); err != nil {
			return err
		}
	}
	unitsDir := filepath.Join(dst, bundle.UnitsDir)
	if err := os.Mkdir(unitsDir, 0o755); err != nil {
		return err
	}
	for name, data := range units.Templates() {
		if err := atomicfile.WriteFile(filepath.Join(unitsDir, name), data, 0o644); err != nil {
			return err
		}
	}
	if err := syncDirs(dst); err != nil {
		return err
	}
	_, err := bundle.WriteManifest(dst, buildinfo.Version, buildinfo.Arch)
	return err
}

func syncDirs(dir string) error {
	if err := atomicfile.SyncDir(filepath.Join(dir, bundle.UnitsDir)); err != nil {
		return err
	}
	return atomicfile.SyncDir(dir)
}

// Link names under the base (hostroot.CurrentLink, hostroot.LastGoodLink).
func checkName(name string) error {
	for _, n := range Names {
		if n == name {
			return nil
		}
	}
	return fmt.Errorf("release name %q: want one of %s", name, strings.Join(Names, ", "))
}

// SetCurrent points <base>/current at releases/<name> (a relative link):
// a temporary link is made next to it and renamed over it, so current
// always names a release.
func SetCurrent(root *hostroot.Root, name string) error {
	return setLink(root, hostroot.CurrentLink, name)
}

// SetLastGood points <base>/last-good at releases/<name>, atomically.
func SetLastGood(root *hostroot.Root, name string) error {
	return setLink(root, hostroot.LastGoodLink, name)
}

// Current returns the release name <base>/current points at.
func Current(root *hostroot.Root) (string, error) { return readLink(root, hostroot.CurrentLink) }

// LastGood returns the release name <base>/last-good points at.
func LastGood(root *hostroot.Root) (string, error) { return readLink(root, hostroot.LastGoodLink) }

// Inactive returns the release name current does not point at: where the
// next release is unpacked.
func Inactive(root *hostroot.Root) (string, error) {
	cur, err := Current(root)
	if err != nil {
		return "", err
	}
	for _, n := range Names {
		if n != cur {
			return n, nil
		}
	}
	return "", fmt.Errorf("no inactive release next to %s", cur)
}

// Dir is the local path of release directory name (which need not exist).
func Dir(root *hostroot.Root, name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	return root.Path(hostroot.ReleasesDir, name)
}

func linkPath(root *hostroot.Root, link string) (string, error) {
	// The link itself, not what it points at.
	base, err := root.Path()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, link), nil
}

func readLink(root *hostroot.Root, link string) (string, error) {
	p, err := linkPath(root, link)
	if err != nil {
		return "", err
	}
	target, err := os.Readlink(p)
	if err != nil {
		return "", fmt.Errorf("read link %s: %w", root.HostPath(link), err)
	}
	dir, name := path.Split(path.Clean(target))
	if path.Clean(dir) != hostroot.ReleasesDir || checkName(name) != nil {
		return "", fmt.Errorf("link %s -> %q: want %s/<%s>", root.HostPath(link), target, hostroot.ReleasesDir, strings.Join(Names, "|"))
	}
	return name, nil
}

func setLink(root *hostroot.Root, link, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	p, err := linkPath(root, link)
	if err != nil {
		return err
	}
	target := path.Join(hostroot.ReleasesDir, name)
	if old, err := os.Readlink(p); err == nil && old == target {
		return nil
	}
	if err := atomicfile.Symlink(target, p); err != nil {
		return fmt.Errorf("point %s at %s: %w", link, target, err)
	}
	return nil
}
