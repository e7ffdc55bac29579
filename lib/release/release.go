// Package release installs this release's binaries into the host root:
// <base>/releases/blue holds the kubeslot* executables and <base>/current is
// a relative link to releases/blue, replaced atomically (a temporary link
// renamed over it). It is the same layout `kubeslot ignition` lays down, so a
// host provisioned by Ignition already has a usable install and nothing is
// copied. The upgrader (issue 8) extends this with green and last-good.
//
// Imported by the bootstrap stage (and later the upgrader); cmd/ binaries
// reach it through lib/bootstrap.
package release

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// Binaries are the executables a complete release holds.
var Binaries = []string{
	"kubeslot",
	"kubeslot-bootstrap",
	"kubeslot-repaver",
	"kubeslot-resetter",
	"kubeslot-upgrader",
	"kubeslot-watcher",
}

// First is the release directory a fresh host starts with.
const First = "blue"

// versionTimeout bounds one `--version` run: a static binary answers in
// milliseconds, one that hangs is not usable.
const versionTimeout = 5 * time.Second

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
	if err != nil {
		if len(out) > 200 {
			out = out[len(out)-200:]
		}
		return fmt.Errorf("%s --version: %v (%q)", p, err, out)
	}
	return nil
}

// Ensure makes <base>/current a usable release. When it already is, it
// does nothing and returns false. Otherwise it copies every binary of
// Binaries from srcDir into <base>/releases/blue (staged in a hidden
// directory and renamed into place, so a half-copied release is never
// visible), checks it, and points current at it; it returns true.
func Ensure(ctx context.Context, root *hostroot.Root, srcDir string, log *slog.Logger) (bool, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	err := Usable(ctx, root)
	if err == nil {
		return false, nil
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
	for _, name := range Binaries {
		if err := copyFile(filepath.Join(srcDir, name), filepath.Join(partial, name)); err != nil {
			return false, fmt.Errorf("install release: %w", err)
		}
	}
	if err := atomicfile.SyncDir(partial); err != nil {
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
	log.Info("release installed", "dir", root.HostPath(hostroot.ReleasesDir, First))
	return true, nil
}

// SetCurrent points <base>/current at releases/<name> (a relative link):
// a temporary link is made next to it and renamed over it, so current
// always names a release.
func SetCurrent(root *hostroot.Root, name string) error {
	// The link itself, not what it points at.
	base, err := root.Path()
	if err != nil {
		return err
	}
	cur := filepath.Join(base, hostroot.CurrentLink)
	target := path.Join(hostroot.ReleasesDir, name)
	if old, err := os.Readlink(cur); err == nil && old == target {
		return nil
	}
	tmp := filepath.Join(filepath.Dir(cur), ".current.tmp")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("point current at %s: %w", target, err)
	}
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("point current at %s: %w", target, err)
	}
	if err := atomicfile.Rename(tmp, cur); err != nil {
		return fmt.Errorf("point current at %s: %w", target, err)
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, io.LimitReader(in, maxBinary+1))
	if err == nil && n > maxBinary {
		err = fmt.Errorf("%s: larger than %d bytes", src, maxBinary)
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}
