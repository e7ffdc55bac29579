// Package unpack extracts a tarball (plain, gzip or zstd) into a directory
// safely: it is how a node rootfs and the kubelet, containerd, runc and CNI
// archives land in a slot. Imported by the nspawn isolation backend (a
// slot's tree) and lib/oci (image layers) only.
//
// The archive is untrusted input even after its sha256 was verified (the
// digest only says it is the file the configuration named). The rules:
//
//   - Entry names are relative: an absolute name or any ".." component is
//     refused, even one that would stay inside ("a/../b"); no real rootfs
//     needs one. "./" prefixes are accepted.
//   - The extractor never follows a symbolic link while writing. Every
//     directory on an entry's path must be a real directory (created by the
//     archive, created here as a missing parent, or already in dest); an
//     entry whose parent is a symlink is refused, whatever the link points
//     to. This stops the two-step attack ("x -> /etc", then "x/passwd") and
//     costs nothing for a tarball of a directory tree, which never lists an
//     entry below a symlink. The last component is never followed either:
//     an existing file, link or empty directory there is replaced, never
//     written through. As a second wall, every operation goes through an
//     os.Root opened on dest, so even a mistake here cannot reach outside.
//   - Symlink targets are stored as written and never dereferenced here.
//     Absolute targets are allowed: they are normal in a rootfs
//     ("/etc/alternatives/x -> /usr/bin/y") and, inside the nspawn machine or
//     through a resolver rooted at the rootfs, start at the rootfs. A
//     relative target that climbs above dest from the link's directory
//     ("etc/x -> ../../../etc/shadow") is refused: it leaves the slot for
//     anything on the host that follows it. The check is lexical, since
//     other links on the way may not exist yet; an escaping link chain is
//     stopped where it is resolved (lib/hostroot refuses it).
//   - A hard link's target follows the entry-name rules and must be an
//     entry already in dest, reached without a symlink on the way; if the
//     target itself is a symlink, the new name links to that symlink, not to
//     what it points at. So a hard link can never name a file outside dest.
//   - Bounds against tar and gzip bombs: Options.MaxFiles entries and
//     Options.MaxBytes bytes of regular-file content.
//
// Kept: mode bits including setuid, setgid and sticky, owner and group (so
// it must run as root unless Options.IgnoreOwner), modification times of
// files and directories, symlinks, hard links, file capabilities. Not kept: device nodes and
// FIFOs (skipped with a debug log: nspawn populates the machine's /dev),
// symlink timestamps (no lutimes in os.Root), extended attributes other
// than file capabilities and user.* (KeptXattr), access times. Plain, gzip and zstd (through
// klauspost/compress, already a dependency; window bounded to 128 MiB)
// tarballs are read; xz and bzip2 are refused with a clear error.
//
// An entry for the archive's root ("./") sets dest's own mode, owner and
// times, as tar does.
//
// When Tar returns an error, dest holds a partial tree: callers extract
// into a fresh directory and remove it on failure. When Tar succeeds, the
// tree is on disk (syncfs).
package unpack

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klauspost/compress/zstd"
)

// Defaults for the zero values of Options' bounds: far above a Debian rootfs
// (tens of thousands of entries, under 1 GB), far below a bomb that fills
// the disk.
const (
	DefaultMaxFiles = 1_000_000
	DefaultMaxBytes = 16 << 30
)

// Errors callers may test with errors.Is.
var (
	// ErrUnsafe: an entry would write outside dest, through a link, or
	// create a link that leaves dest.
	ErrUnsafe = errors.New("refused")
	// ErrLimit: the archive is over Options.MaxFiles or Options.MaxBytes.
	ErrLimit = errors.New("over the bound")
)

// Options tune Tar. The zero value is usable.
type Options struct {
	Log *slog.Logger
	// MaxFiles bounds the number of entries (all types); 0 means
	// DefaultMaxFiles.
	MaxFiles int
	// MaxBytes bounds the total size of regular files; 0 means
	// DefaultMaxBytes.
	MaxBytes int64
	// RequireEmpty refuses a dest that exists and holds anything.
	RequireEmpty bool
	// IgnoreOwner leaves every entry owned by the running user instead of
	// the archive's uid/gid: for release archives built on a CI machine
	// whose uids mean nothing here.
	IgnoreOwner bool
}

// EntryError names the archive entry a failure is about.
type EntryError struct {
	Name string // as written in the archive
	Err  error
}

func (e *EntryError) Error() string { return fmt.Sprintf("tar entry %q: %v", e.Name, e.Err) }
func (e *EntryError) Unwrap() error { return e.Err }

// Tar extracts the tar stream r (plain, gzip or zstd, detected from its first
// bytes) into dest, a local directory created if missing. See the package
// comment for what is refused and what is kept.
func Tar(ctx context.Context, r io.Reader, dest string, opts Options) error {
	if err := tarInto(ctx, r, dest, opts); err != nil {
		return fmt.Errorf("unpack into %s: %w", dest, err)
	}
	return nil
}

func tarInto(ctx context.Context, r io.Reader, dest string, opts Options) error {
	if !filepath.IsAbs(dest) {
		return errors.New("destination must be an absolute path")
	}
	if err := prepareDest(dest, opts.RequireEmpty); err != nil {
		return err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return err
	}
	defer root.Close()

	src, closeSrc, err := decompress(bufio.NewReaderSize(r, 64<<10))
	if err != nil {
		return err
	}
	defer closeSrc()
	x := newExtractor(root, opts)
	start := time.Now()
	tr := tar.NewReader(src)
	last := ""
	for {
		if err := context.Cause(ctx); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if last == "" {
				return fmt.Errorf("read archive: %w", err)
			}
			return fmt.Errorf("read archive after entry %q: %w", last, err)
		}
		last = hdr.Name
		if err := x.entry(ctx, hdr, tr); err != nil {
			return &EntryError{Name: hdr.Name, Err: err}
		}
	}
	if x.entries == 0 {
		return errors.New("the archive holds no entries")
	}
	// Read what follows the end-of-archive blocks, so a gzip stream's
	// checksum is verified; the sha256 of the file was checked before, so
	// this only guards against a decoder problem.
	if _, err := io.Copy(io.Discard, io.LimitReader(src, 1<<20)); err != nil {
		return fmt.Errorf("read archive trailer: %w", err)
	}
	if err := x.checkLinks(); err != nil {
		return err
	}
	if err := x.finishDirs(); err != nil {
		return err
	}
	syncStart := time.Now()
	if err := syncfs(root); err != nil {
		return err
	}
	d := time.Since(start)
	x.log.Info("unpacked archive", "dest", dest, "entries", x.entries, "files", x.files,
		"dirs", x.dirCount, "symlinks", x.symlinks, "hardlinks", x.hardlinks, "skipped", x.skipped, "xattrs_not_restored", x.xattrs,
		"bytes", x.bytes, "duration", d.Round(time.Millisecond), "sync", time.Since(syncStart).Round(time.Millisecond),
		"mb_per_s", fmt.Sprintf("%.1f", float64(x.bytes)/max(d.Seconds(), 1e-9)/1e6))
	return nil
}

func prepareDest(dest string, requireEmpty bool) error {
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return err
	}
	if !requireEmpty {
		return nil
	}
	d, err := os.Open(dest)
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if err != nil && err != io.EOF {
		return err
	}
	if len(names) > 0 {
		return fmt.Errorf("destination is not empty (holds %q)", names[0])
	}
	return nil
}

// Magic numbers of the formats we recognize.
var (
	magicGzip  = []byte{0x1f, 0x8b}
	magicZstd  = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicXz    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicBzip2 = []byte("BZh")
)

// maxZstdWindow bounds the memory a zstd stream may ask for (zstd --long=27
// uses 128 MiB; the default levels at most 8 MiB).
const maxZstdWindow = 128 << 20

func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	none := func() {}
	head, err := br.Peek(6)
	if err != nil && err != io.EOF {
		return nil, none, fmt.Errorf("read archive: %w", err)
	}
	switch {
	case len(head) == 0:
		return nil, none, errors.New("the archive is empty")
	case bytes.HasPrefix(head, magicGzip):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, none, fmt.Errorf("gzip: %w", err)
		}
		return zr, none, nil
	case bytes.HasPrefix(head, magicZstd):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, none, fmt.Errorf("zstd: %w", err)
		}
		return zstdErrors{zr}, zr.Close, nil
	case bytes.HasPrefix(head, magicXz):
		return nil, none, errors.New("xz-compressed archives are not supported; use gzip, zstd or plain tar")
	case bytes.HasPrefix(head, magicBzip2):
		return nil, none, errors.New("bzip2-compressed archives are not supported; use gzip, zstd or plain tar")
	}
	return br, none, nil
}

// zstdErrors names the format in the decoder's errors.
type zstdErrors struct{ r io.Reader }

func (z zstdErrors) Read(p []byte) (int, error) {
	n, err := z.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("zstd: %w", err)
	}
	return n, err
}

// syncfs makes the whole extracted tree durable with one call instead of an
// fsync per file.
func syncfs(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	rc, err := d.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.Syncfs(int(fd))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("syncfs: %w", serr)
	}
	return nil
}
