package artifact

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/mountinfo"
)

// Every writer of the cache names what it is still writing with a leading
// dot: a download's ".<hex>.tmp-*" (Fetcher.store), a flattened image's
// ".<name>.tmp-*" (lib/oci), a sidecar's ".<name>.tmp-*" (lib/atomicfile)
// and a clean tree's ".<hex>.partial" staging directory (the nspawn
// backend). Finished entries never start with a dot. Every writer holds the
// installation lock while it writes, so a dot entry found by a process
// holding the lock is what a killed writer left.

// Prune removes from the cache every entry that no digest in keep names,
// and everything a killed writer left (see RemoveStale): in sha256/ the
// files not named by a kept digest, in oci/ the flattened images and
// archives (with their sidecars) of other digests, in trees/ the trees of
// other digests. keep is validated before anything is removed. The caller
// must hold the installation lock, so no stage is writing the cache.
func (f *Fetcher) Prune(keep []string) error {
	want := make(map[string]bool, len(keep))
	for _, k := range keep {
		d, err := normalDigest(k)
		if err != nil {
			return fmt.Errorf("prune artifact cache: keep %q: %w", k, err)
		}
		want[d] = true
	}
	if f.Root == nil {
		return errors.New("prune artifact cache: no host root")
	}
	kept := map[string]func(name string) bool{
		CacheSubdir: func(name string) bool { return want[name] },
		// <digest>-<os>-<arch>.tar, .image.tar and their .sha256 sidecars.
		OCISubdir: func(name string) bool {
			d, rest, ok := strings.Cut(name, "-")
			return ok && rest != "" && want[d]
		},
		TreesSubdir: func(name string) bool { return want[name] },
	}
	return f.sweep("prune artifact cache", func(sub, name string) bool { return !kept[sub](name) })
}

// RemoveStale removes what killed writers left in the cache: the dot
// entries of sha256/, oci/ and trees/ (temporary files and staging
// directories), and nothing else. The caller must hold the installation
// lock: every writer of the cache holds it while a temporary file exists,
// so none of them is a file another process is writing.
func RemoveStale(root *hostroot.Root, log *slog.Logger) error {
	f := &Fetcher{Root: root, Log: log}
	return f.sweep("remove stale temporary files from the artifact cache", func(_, name string) bool {
		return strings.HasPrefix(name, ".")
	})
}

// sweep removes the entries of the cache's directories for which drop says
// so, and every dot entry.
func (f *Fetcher) sweep(what string, drop func(sub, name string) bool) error {
	if f.Root == nil {
		return fmt.Errorf("%s: no host root", what)
	}
	log := f.logger()
	var errs []error
	for _, sub := range []string{CacheSubdir, OCISubdir, TreesSubdir} {
		dir, err := f.Root.Path(hostroot.CacheDir, sub)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		removed := 0
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") && !drop(sub, e.Name()) {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if err := removeEntry(p, e); err != nil {
				errs = append(errs, err)
				continue
			}
			removed++
			log.Info("removed from the artifact cache", "path", p, "stale", strings.HasPrefix(e.Name(), "."))
		}
		if removed > 0 {
			if err := atomicfile.SyncDir(dir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// removeEntry removes a file, or a tree (a clean rootfs tree or its
// staging directory) unless something is mounted inside it.
func removeEntry(p string, e fs.DirEntry) error {
	if !e.IsDir() {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	mounts, err := mountinfo.Under(p)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return fmt.Errorf("%s: mount points inside (%s): not removed", p, strings.Join(mounts, ", "))
	}
	return os.RemoveAll(p)
}
