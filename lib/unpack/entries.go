package unpack

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// extractor holds the state of one Tar call.
type extractor struct {
	root *os.Root
	opts Options
	log  *slog.Logger
	// dirs holds names known to be real directories (not links), so a
	// deep tree is not checked component by component for every entry.
	// A name leaves it when its directory is removed.
	dirs     map[string]bool
	dirTimes []dirTime // applied last: extracting children changes them
	buf      []byte

	// linkNames are the symbolic links made, checked again once the whole
	// tree is there (a later entry can change what an earlier link meets).
	linkNames []string

	entries, files, dirCount, symlinks, hardlinks, skipped, xattrs int
	bytes                                                          int64
}

type dirTime struct {
	name  string
	atime time.Time
	mtime time.Time
}

func newExtractor(root *os.Root, opts Options) *extractor {
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &extractor{
		root: root,
		opts: opts,
		log:  log,
		dirs: map[string]bool{".": true},
		buf:  make([]byte, 256<<10),
	}
}

func (x *extractor) entry(ctx context.Context, hdr *tar.Header, r io.Reader) error {
	if x.entries++; x.entries > x.opts.MaxFiles {
		return fmt.Errorf("%w: more than %d entries (MaxFiles)", ErrLimit, x.opts.MaxFiles)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // pax defaults for later entries; archive/tar applies them
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." && hdr.Typeflag != tar.TypeDir {
		return fmt.Errorf("%w: a non-directory entry names the destination itself", ErrUnsafe)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(name, hdr)
	case tar.TypeReg, tar.TypeGNUSparse: // archive/tar expands sparse content
		return x.file(ctx, name, hdr, r)
	case tar.TypeSymlink:
		return x.symlink(name, hdr)
	case tar.TypeLink:
		return x.hardlink(name, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		x.skipped++
		x.log.Debug("skipped device node or FIFO", "name", name, "type", string(hdr.Typeflag))
		return nil
	}
	return fmt.Errorf("%w: unsupported entry type %q", ErrUnsafe, hdr.Typeflag)
}

// cleanName checks an entry name (or a hard link target) and returns it
// cleaned and relative, "." for the archive's root.
func cleanName(raw string) (string, error) {
	switch {
	case raw == "":
		return "", fmt.Errorf("%w: empty name", ErrUnsafe)
	case strings.HasPrefix(raw, "/"):
		return "", fmt.Errorf("%w: absolute path", ErrUnsafe)
	}
	for _, c := range strings.Split(raw, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: \"..\" in the path", ErrUnsafe)
		}
	}
	return path.Clean(raw), nil
}

// parents makes sure every directory above name is a real directory,
// creating missing ones (0755, owned by the running user) when create is
// set. A symlink on the way is refused: the extractor never writes through
// one.
func (x *extractor) parents(name string, create bool) error {
	dir := path.Dir(name)
	if x.dirs[dir] {
		return nil
	}
	cur := ""
	for _, c := range strings.Split(dir, "/") {
		cur = path.Join(cur, c)
		if x.dirs[cur] {
			continue
		}
		fi, err := x.root.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := x.root.Mkdir(cur, 0o755); err != nil {
				return err
			}
			if err := x.root.Chmod(cur, 0o755); err != nil { // past the umask
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%w: %q on the path is a symbolic link; the extractor never writes through links", ErrUnsafe, cur)
		case !fi.IsDir():
			return fmt.Errorf("%q on the path is not a directory", cur)
		}
		x.dirs[cur] = true
	}
	return nil
}

// clear removes what is at name so a non-directory can be created there,
// never writing through it. A non-empty directory is an error.
func (x *extractor) clear(name string) error {
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		x.forget(name)
	}
	if err := x.root.Remove(name); err != nil {
		return fmt.Errorf("replace existing %s: %w", kind(fi), err)
	}
	return nil
}

func kind(fi fs.FileInfo) string {
	switch {
	case fi.IsDir():
		return "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		return "symbolic link"
	case fi.Mode().IsRegular():
		return "file"
	}
	return "special file"
}

// forget drops a removed directory and everything below it from the cache.
func (x *extractor) forget(name string) {
	for d := range x.dirs {
		if d == name || strings.HasPrefix(d, name+"/") {
			delete(x.dirs, d)
		}
	}
}

func (x *extractor) dir(name string, hdr *tar.Header) error {
	if name != "." {
		if err := x.parents(name, true); err != nil {
			return err
		}
		fi, err := x.root.Lstat(name)
		if err == nil && !fi.IsDir() {
			if err := x.root.Remove(name); err != nil {
				return fmt.Errorf("replace existing %s: %w", kind(fi), err)
			}
		}
		if err != nil || !fi.IsDir() {
			if err := x.root.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
		x.dirs[name] = true
	}
	if err := x.owner(name, hdr); err != nil {
		return err
	}
	if err := x.root.Chmod(name, mode(hdr)); err != nil {
		return err
	}
	x.dirCount++
	x.dirTimes = append(x.dirTimes, dirTime{name, atime(hdr), hdr.ModTime})
	return nil
}

func (x *extractor) file(ctx context.Context, name string, hdr *tar.Header, r io.Reader) (err error) {
	if hdr.Size < 0 || hdr.Size > x.opts.MaxBytes-x.bytes {
		return fmt.Errorf("%w: %d bytes would bring the total over %d (MaxBytes)", ErrLimit, hdr.Size, x.opts.MaxBytes)
	}
	if err := x.parents(name, true); err != nil {
		return err
	}
	if err := x.clear(name); err != nil {
		return err
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	var n int64
	for {
		if err := context.Cause(ctx); err != nil {
			return err
		}
		k, rerr := r.Read(x.buf)
		if k > 0 {
			if _, err := f.Write(x.buf[:k]); err != nil {
				return err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read content: %w", rerr)
		}
	}
	x.bytes += n
	// chown before chmod: changing the owner clears setuid and setgid.
	if !x.opts.IgnoreOwner {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := f.Chmod(mode(hdr)); err != nil {
		return err
	}
	// After the chown, which clears a file capability.
	if err := x.setXattrs(f, name, hdr); err != nil {
		return err
	}
	if err := x.root.Chtimes(name, atime(hdr), hdr.ModTime); err != nil {
		return err
	}
	x.files++
	return nil
}

// KeptXattr says which extended attributes of a regular file are restored
// (and kept by a copy of a tree made from one): file capabilities (a real
// rootfs gives ping cap_net_raw rather than setuid) and user attributes.
// Others (security labels, trusted.*) belong to the system that made the
// archive, not to the node.
func KeptXattr(name string) bool {
	return name == "security.capability" || strings.HasPrefix(name, "user.")
}

// setXattrs restores hdr's kept extended attributes on f; those it does not
// keep, and those the filesystem cannot hold, are counted in the summary.
func (x *extractor) setXattrs(f *os.File, name string, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if !KeptXattr(attr) {
			x.xattrs++
			continue
		}
		err := unix.Fsetxattr(int(f.Fd()), attr, []byte(v), 0)
		switch {
		case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EOPNOTSUPP):
			x.xattrs++
			x.log.Warn("extended attribute not restored: the filesystem does not hold it", "name", name, "attr", attr)
		case err != nil:
			return fmt.Errorf("extended attribute %s: %w", attr, err)
		}
	}
	return nil
}

func (x *extractor) symlink(name string, hdr *tar.Header) error {
	target := hdr.Linkname
	if target == "" {
		return fmt.Errorf("%w: symbolic link with an empty target", ErrUnsafe)
	}
	if !path.IsAbs(target) {
		if to := path.Join(path.Dir(name), target); to == ".." || strings.HasPrefix(to, "../") {
			return fmt.Errorf("%w: symbolic link target %q leaves the destination", ErrUnsafe, target)
		}
	}
	if err := x.parents(name, true); err != nil {
		return err
	}
	if err := x.clear(name); err != nil {
		return err
	}
	if err := x.root.Symlink(target, name); err != nil {
		return err
	}
	// Each link passed the lexical check, but a chain of them (d/l -> ..,
	// then x -> d/l/..) can still lead out: resolve it as a tool following
	// it would.
	if err := x.checkResolves(name, target); err != nil {
		_ = x.root.Remove(name)
		return err
	}
	x.linkNames = append(x.linkNames, name)
	if !x.opts.IgnoreOwner {
		if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	x.symlinks++
	return nil
}

func (x *extractor) hardlink(name string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if target == "." {
		return fmt.Errorf("%w: hard link to the destination itself", ErrUnsafe)
	}
	if target == name {
		return nil // a link to itself is already there
	}
	if err := x.parents(target, false); err != nil {
		return fmt.Errorf("hard link target %q: %w", target, err)
	}
	fi, err := x.root.Lstat(target)
	if err != nil {
		return fmt.Errorf("hard link target %q (it must be an earlier entry): %w", target, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("%w: hard link to directory %q", ErrUnsafe, target)
	}
	if err := x.parents(name, true); err != nil {
		return err
	}
	if err := x.clear(name); err != nil {
		return err
	}
	if err := x.root.Link(target, name); err != nil {
		return err
	}
	x.hardlinks++
	return nil
}

// maxLinkHops bounds link expansion, like the kernel's ELOOP limit.
const maxLinkHops = 40

// checkResolves refuses the link at name when following it, and every link
// met on the way (absolute ones starting again at the destination, as in
// the node), climbs above the destination.
func (x *extractor) checkResolves(name, target string) error {
	leaves, err := x.leaves(name)
	if err != nil {
		return err
	}
	if leaves {
		return fmt.Errorf("%w: symbolic link target %q leaves the destination through the links it resolves through", ErrUnsafe, target)
	}
	return nil
}

// leaves resolves name (a path in the destination) component by component,
// following links, and reports whether a ".." climbs above the
// destination. Missing components, files in the middle and link loops end
// nowhere outside, so they are fine here.
func (x *extractor) leaves(name string) (bool, error) {
	todo := strings.Split(name, "/")
	var done []string
	hops := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				return true, nil
			}
			done = done[:len(done)-1]
			continue
		}
		cur := path.Join(path.Join(done...), c)
		fi, err := x.root.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
			done = append(done, c)
			continue
		case err != nil:
			return false, err
		case fi.Mode()&fs.ModeSymlink == 0:
			done = append(done, c)
			continue
		}
		if hops++; hops > maxLinkHops {
			return false, nil
		}
		t, err := x.root.Readlink(cur)
		if err != nil {
			return false, err
		}
		if path.IsAbs(t) {
			done = nil
		}
		todo = append(strings.Split(t, "/"), todo...)
	}
	return false, nil
}

// checkLinks checks every link again once the tree is complete.
func (x *extractor) checkLinks() error {
	for _, name := range x.linkNames {
		fi, err := x.root.Lstat(name)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue // replaced by a later entry
		}
		target, err := x.root.Readlink(name)
		if err != nil {
			return &EntryError{Name: name, Err: err}
		}
		if err := x.checkResolves(name, target); err != nil {
			return &EntryError{Name: name, Err: err}
		}
	}
	return nil
}

// owner sets uid and gid of a directory (files use their descriptor).
func (x *extractor) owner(name string, hdr *tar.Header) error {
	if x.opts.IgnoreOwner {
		return nil
	}
	return x.root.Lchown(name, hdr.Uid, hdr.Gid)
}

// finishDirs sets directory times last, deepest first, skipping any that a
// later entry replaced.
func (x *extractor) finishDirs() error {
	for i := len(x.dirTimes) - 1; i >= 0; i-- {
		d := x.dirTimes[i]
		fi, err := x.root.Lstat(d.name)
		if err != nil || !fi.IsDir() {
			continue
		}
		if err := x.root.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return fmt.Errorf("set times of %s: %w", d.name, err)
		}
	}
	return nil
}

// mode is the entry's permission bits with setuid, setgid and sticky.
func mode(hdr *tar.Header) fs.FileMode {
	return hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

func atime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}
