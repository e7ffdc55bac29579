package nspawn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/unpack"
)

// The clean-tree cache: each rootfs digest is unpacked once, into
// <base>/cache/trees/<sha256>/rootfs. A slot is that tree as the lower
// layer of an overlay (overlay.go), or, where overlayfs cannot work, a copy
// of it (a reflink per file where the filesystem has them), which costs
// about a plain copy instead of a gunzip and untar.
//
// A tree is built in a staging directory next to it, its marker written
// last, then renamed into place; it is never modified afterwards. A tree
// directory without a marker naming its digest is not trusted and is built
// again. The trees directory is 0700: a rootfs holds setuid binaries, as
// under /var/lib/machines (0700). Everything under the host root's cache
// goes with a reset (lib/reset removes the whole host root).
const (
	treesDir   = artifact.TreesSubdir // lib/artifact owns the cache's layout and prunes it
	treeRootfs = "rootfs"
	treeMarker = "complete.json"
)

// treeStamp is a tree's marker: the digest it was unpacked from.
type treeStamp struct {
	RootFS  string    `json:"rootfs"`
	BuiltAt time.Time `json:"builtAt"`
}

// cleanTree returns the local path of the verified, unpacked tree of the
// rootfs tarball tarball (sha256 digest), building it first when it is
// missing or has no valid marker. Trees of other digests are removed after a
// new one is built, but those a layered slot stands on: one clean tree per
// slot is enough (a repave that keeps the rootfs reuses it), and each is as
// large as the rootfs.
func (b *Backend) cleanTree(ctx context.Context, digest, tarball string) (string, error) {
	digest = strings.ToLower(digest)
	if !validDigest(digest) {
		return "", fmt.Errorf("rootfs sha256 %q: not 64 lowercase hex digits", digest)
	}
	trees, err := b.root.Path(hostroot.CacheDir, treesDir)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(trees, digest)
	if ok, err := treeValid(dir, digest); err != nil {
		return "", err
	} else if ok {
		return filepath.Join(dir, treeRootfs), nil
	}
	if tarball == "" {
		return "", fmt.Errorf("tree cache: no valid tree of rootfs %s and no tarball to unpack (a re-run fetches it)", digest)
	}
	t0 := time.Now()
	if err := os.MkdirAll(trees, 0o700); err != nil {
		return "", fmt.Errorf("tree cache %s: %w", trees, err)
	}
	if err := os.Chmod(trees, 0o700); err != nil {
		return "", fmt.Errorf("tree cache %s: %w", trees, err)
	}
	staging := filepath.Join(trees, "."+digest+".partial")
	for _, p := range []string{staging, dir} { // left by a crash, or without a marker
		if err := removeTree(p); err != nil {
			return "", fmt.Errorf("tree cache: %w", err)
		}
	}
	if err := os.Mkdir(staging, 0o700); err != nil {
		return "", fmt.Errorf("tree cache: %w", err)
	}
	err = unpackFile(ctx, tarball, filepath.Join(staging, treeRootfs), unpack.Options{Log: b.log, RequireEmpty: true})
	if err == nil {
		err = atomicfile.WriteJSON(filepath.Join(staging, treeMarker), treeStamp{RootFS: digest, BuiltAt: time.Now().UTC()}, 0o600)
	}
	if err == nil {
		err = atomicfile.Rename(staging, dir)
	}
	if err != nil {
		if rerr := removeTree(staging); rerr != nil {
			b.log.Warn("could not remove the tree staging directory", "path", staging, "err", rerr)
		}
		return "", fmt.Errorf("tree cache: unpack rootfs %s: %w", digest, err)
	}
	b.log.Info("clean rootfs tree cached", "rootfs", digest, "path", dir, "took", time.Since(t0).Round(time.Millisecond))
	b.pruneTrees(trees, digest)
	return filepath.Join(dir, treeRootfs), nil
}

// haveTree reports whether digest's clean tree is there and finished.
func (b *Backend) haveTree(digest string) bool {
	digest = strings.ToLower(digest)
	if !validDigest(digest) {
		return false
	}
	dir, err := b.root.Path(hostroot.CacheDir, treesDir, digest)
	if err != nil {
		return false
	}
	ok, err := treeValid(dir, digest)
	return ok && err == nil
}

// treeValid reports whether dir is a finished tree of digest.
func treeValid(dir, digest string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, treeMarker))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("tree cache: %w", err)
	}
	var s treeStamp
	if json.Unmarshal(data, &s) != nil || s.RootFS != digest {
		return false, nil
	}
	fi, err := os.Lstat(filepath.Join(dir, treeRootfs))
	if err != nil || !fi.IsDir() {
		return false, nil
	}
	return true, nil
}

// pruneTrees removes every tree but keep's and those a slot's layers name
// (a mounted slot's lower must stay); a failure only costs disk.
func (b *Backend) pruneTrees(trees, keep string) {
	inUse, _ := b.treesInUse()
	if inUse == nil {
		return // a layer record could not be read: keep them all
	}
	entries, err := os.ReadDir(trees)
	if err != nil {
		b.log.Warn("could not list the tree cache", "path", trees, "err", err)
		return
	}
	for _, e := range entries {
		if e.Name() == keep || !e.IsDir() || inUse[e.Name()] {
			continue
		}
		if err := removeTree(filepath.Join(trees, e.Name())); err != nil {
			b.log.Warn("could not prune a cached tree", "path", filepath.Join(trees, e.Name()), "err", err)
			continue
		}
		b.log.Info("cached tree pruned", "path", filepath.Join(trees, e.Name()))
	}
}

func validDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// copyTree copies the local tree src into dst, which must not exist: every
// directory, regular file, symlink, hard link, device node and FIFO, with
// its mode (setuid/setgid/sticky included), owner and times. Regular files
// are cloned (FICLONE) where the filesystem shares extents (btrfs, xfs with
// reflink), else copied in the kernel (copy_file_range). Links are never
// followed. The copy is made durable with one syncfs at the end.
//
// Why not `cp -a --reflink=auto` through the exec runner: the copy is part
// of a crash-safe provision whose unit tests run without a host, and a Go
// copy needs no particular coreutils; the cost is the same (the rig's repave
// test prints both).
func copyTree(ctx context.Context, src, dst string) (copyStats, error) {
	c := &copier{src: src, dst: dst, links: map[inodeKey]string{}}
	c.clone.Store(true)
	err := c.run(ctx)
	c.stats.Cloned = c.cloned.Load()
	return c.stats, err
}

type copyStats struct {
	Files, Dirs, Symlinks, Hardlinks, Special int
	Bytes                                     int64
	Cloned                                    bool
}

type inodeKey struct{ dev, ino uint64 }

// copyWorkers copy regular files in parallel: the copy is bound by
// per-file system calls as much as by bytes.
const copyWorkers = 4

type copier struct {
	src, dst string
	// links maps a multiply linked source inode to its first copy.
	links map[inodeKey]string
	// hardlinks are made after every file is copied: [first, link].
	hardlinks [][2]string
	// clone is cleared after the first file the filesystem cannot clone.
	clone, cloned atomic.Bool
	// dirs are set (mode, times) after their content, deepest first.
	dirs  []dirMeta
	stats copyStats
}

type dirMeta struct {
	path string
	st   unix.Stat_t
}

type fileJob struct {
	src, dst string
	st       unix.Stat_t
}

func (c *copier) run(ctx context.Context) error {
	if _, err := os.Lstat(c.dst); err == nil {
		return fmt.Errorf("copy into %s: it exists already", c.dst)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan fileJob, 256)
	var wg sync.WaitGroup
	for range copyWorkers {
		wg.Go(func() {
			for j := range jobs {
				if ctx.Err() != nil {
					continue // drain
				}
				if err := c.file(j); err != nil {
					rel, _ := filepath.Rel(c.dst, j.dst)
					cancel(fmt.Errorf("copy /%s: %w", filepath.ToSlash(rel), err))
				}
			}
		})
	}
	n := 0
	err := filepath.WalkDir(c.src, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n%256 == 0 {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
		}
		rel, err := filepath.Rel(c.src, p)
		if err != nil {
			return err
		}
		if err := c.entry(p, filepath.Join(c.dst, rel), jobs); err != nil {
			return fmt.Errorf("copy %s: %w", path.Join("/", filepath.ToSlash(rel)), err)
		}
		return nil
	})
	close(jobs)
	wg.Wait()
	if err == nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	if err != nil {
		return err
	}
	for _, l := range c.hardlinks {
		if err := os.Link(l[0], l[1]); err != nil {
			return fmt.Errorf("copy: hard link: %w", err)
		}
	}
	// Directory modes and times last: writing into a directory changes
	// its mtime, and a read-only directory would refuse its children.
	for i := len(c.dirs) - 1; i >= 0; i-- {
		d := c.dirs[i]
		if err := setMeta(d.path, &d.st, false); err != nil {
			return fmt.Errorf("copy %s: %w", d.path, err)
		}
	}
	return syncfs(c.dst)
}

// entry copies one entry; a regular file's copy is handed to the workers.
func (c *copier) entry(src, dst string, jobs chan<- fileJob) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		c.dirs = append(c.dirs, dirMeta{dst, st})
		c.stats.Dirs++
		return nil
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		c.stats.Symlinks++
		return setMeta(dst, &st, true)
	}
	if st.Nlink > 1 {
		k := inodeKey{uint64(st.Dev), st.Ino}
		if first, ok := c.links[k]; ok {
			c.hardlinks = append(c.hardlinks, [2]string{first, dst})
			c.stats.Hardlinks++
			return nil
		}
		c.links[k] = dst
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		c.stats.Files++
		c.stats.Bytes += st.Size
		jobs <- fileJob{src, dst, st}
		return nil
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		if err := unix.Mknod(dst, st.Mode&unix.S_IFMT|0o600, int(st.Rdev)); err != nil {
			return err
		}
		c.stats.Special++
		return setMeta(dst, &st, false)
	}
	return fmt.Errorf("file type %#o not copied", st.Mode&unix.S_IFMT)
}

// file copies a regular file: a clone, else an in-kernel copy; then its
// owner, mode and times.
func (c *copier) file(j fileJob) error {
	in, err := unix.Open(j.src, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	out, err := unix.Open(j.dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	err = c.content(in, out, j.st.Size)
	if err == nil {
		err = unix.Fchown(out, int(j.st.Uid), int(j.st.Gid))
	}
	if err == nil { // after chown, which clears setuid and setgid
		err = unix.Fchmod(out, j.st.Mode&0o7777)
	}
	if err == nil { // after chown too, which clears a file capability
		err = copyXattrs(in, out)
	}
	if cerr := unix.Close(out); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	ts := []unix.Timespec{j.st.Atim, j.st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, j.dst, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func (c *copier) content(in, out int, size int64) error {
	if size == 0 {
		return nil
	}
	if c.clone.Load() {
		err := unix.IoctlFileClone(out, in)
		if err == nil {
			c.cloned.Store(true)
			return nil
		}
		// Not this filesystem (or not across these two): copy from now on.
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EXDEV) &&
			!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("clone: %w", err)
		}
		c.clone.Store(false)
	}
	var done int64
	for done < size {
		n, err := unix.CopyFileRange(in, nil, out, nil, int(min(size-done, 1<<30)), 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil && done == 0 && (errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) ||
			errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
			return readWrite(in, out, size)
		}
		if err != nil {
			return fmt.Errorf("copy_file_range: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("copied %d bytes of %d (changed while copied?)", done, size)
		}
		done += int64(n)
	}
	return nil
}

// readWrite is the copy where copy_file_range cannot work.
func readWrite(in, out int, size int64) error {
	buf := make([]byte, 1<<20)
	var done int64
	for {
		n, err := unix.Read(in, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if n == 0 {
			break
		}
		for w := buf[:n]; len(w) > 0; {
			m, err := unix.Write(out, w)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return fmt.Errorf("write: %w", err)
			}
			w = w[m:]
		}
		done += int64(n)
	}
	if done != size {
		return fmt.Errorf("copied %d bytes of %d (changed while copied?)", done, size)
	}
	return nil
}

// setMeta sets owner, then mode (chown clears setuid and setgid), then
// times. A symlink gets owner and times only: it has no mode of its own.
func setMeta(p string, st *unix.Stat_t, link bool) error {
	if err := unix.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if !link {
		if err := unix.Chmod(p, st.Mode&0o7777); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

// copyXattrs copies the extended attributes the tree keeps (file
// capabilities, user.*: unpack.KeptXattr) from in to out.
func copyXattrs(in, out int) error {
	buf := make([]byte, 4096)
	n, err := unix.Flistxattr(in, buf)
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ERANGE) || n <= 0 {
		return nil // none, or none this filesystem holds
	}
	if err != nil {
		return err
	}
	val := make([]byte, 64<<10)
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if !unpack.KeptXattr(name) {
			continue
		}
		m, err := unix.Fgetxattr(in, name, val)
		if err != nil {
			return fmt.Errorf("read extended attribute %s: %w", name, err)
		}
		if err := unix.Fsetxattr(out, name, val[:m], 0); err != nil {
			return fmt.Errorf("extended attribute %s: %w", name, err)
		}
	}
	return nil
}
