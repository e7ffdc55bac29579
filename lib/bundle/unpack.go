package bundle

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// maxTrailer bounds what may follow the tar end-of-archive blocks inside the
// gzip stream (tar blocking pads to 10 KiB; 1 MiB is generous).
const maxTrailer = 1 << 20

// Unpack checks the bundle at path (its sha256 against wantSHA256 when not
// empty, before anything else), unpacks it safely into dest (which must not
// exist; staged next to it and renamed into place, so a half-unpacked release
// is never visible), and verifies the result with VerifyDir. Errors about the
// content wrap ErrInvalid and name the entry, field and value.
//
// Why not lib/unpack: it is built for a node rootfs and keeps what a rootfs
// needs (symlinks, hard links, owners, setuid bits, "./" names, device
// entries skipped rather than refused). A bundle has a fixed shape, so this
// small reader refuses everything outside it before writing a byte: the
// manifest comes first, and every later entry must be a regular file the
// manifest lists, with its size and mode, or the units/ directory; its
// content is hashed while written and compared at once. Files are written
// through an os.Root on the staging directory, with O_EXCL|O_NOFOLLOW.
//
// A stale <dest>.partial (from a crash) is removed first; on failure the
// staging directory is removed, so dest and <dest>.partial are both absent.
func Unpack(ctx context.Context, path, wantSHA256, wantArch, dest string, lim Limits) (*Manifest, error) {
	if lim.MaxSize <= 0 {
		lim.MaxSize = DefaultMaxSize
	}
	if wantSHA256 != "" {
		if err := CheckSHA256(wantSHA256); err != nil {
			return nil, fmt.Errorf("unpack %s: expected %w", path, err)
		}
	}
	if !filepath.IsAbs(dest) {
		return nil, fmt.Errorf("unpack %s: destination %q must be an absolute path", path, dest)
	}
	dest = filepath.Clean(dest)
	if _, err := os.Lstat(dest); err == nil {
		return nil, fmt.Errorf("unpack %s: destination %s already exists", path, dest)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("unpack %s: %w", path, err)
	}

	f, err := hostroot.OpenInput(path) // a FIFO would hang the reader
	if err != nil {
		return nil, fmt.Errorf("unpack: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("unpack: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("unpack %s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if fi.Size() > lim.MaxSize {
		return nil, invalid("%s: %d bytes, over the limit of %d (MaxSize)", path, fi.Size(), lim.MaxSize)
	}
	if wantSHA256 != "" {
		h := sha256.New()
		if _, err := io.Copy(h, io.LimitReader(f, lim.MaxSize+1)); err != nil {
			return nil, fmt.Errorf("unpack: read %s: %w", path, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != wantSHA256 {
			return nil, invalid("%s: sha256 %s, expected %s", path, got, wantSHA256)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("unpack: %w", err)
		}
	}

	partial := dest + ".partial"
	if err := os.RemoveAll(partial); err != nil {
		return nil, fmt.Errorf("unpack %s: remove stale %s: %w", path, partial, err)
	}
	if err := os.Mkdir(partial, dirMode); err != nil {
		return nil, fmt.Errorf("unpack %s: %w", path, err)
	}
	m, err := stage(ctx, f, path, wantSHA256, wantArch, partial, lim)
	if err == nil {
		err = rename(partial, dest)
	}
	if err != nil {
		if rerr := os.RemoveAll(partial); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove %s: %w", partial, rerr))
		}
		return nil, err
	}
	return m, nil
}

// stage unpacks the open bundle into the empty directory partial, syncs it
// and verifies it.
func stage(ctx context.Context, f *os.File, path, wantSHA256, wantArch, partial string, lim Limits) (*Manifest, error) {
	if err := os.Chmod(partial, dirMode); err != nil { // past the umask
		return nil, err
	}
	root, err := os.OpenRoot(partial)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	src := &fileReader{r: io.LimitReader(f, lim.MaxSize), h: sha256.New()}
	r := &reader{ctx: ctx, root: root, src: src, lim: lim}
	if _, err := r.run(wantArch); err != nil {
		if src.err != nil {
			// The host failed to read the file: not the bundle's fault.
			return nil, fmt.Errorf("unpack: read %s: %w", path, src.err)
		}
		return nil, fmt.Errorf("unpack %s: %w", path, err)
	}
	// What was unpacked must be what was checked: the open file may have
	// been rewritten in place between the check and the unpacking.
	if wantSHA256 != "" {
		if got := hex.EncodeToString(src.h.Sum(nil)); got != wantSHA256 {
			return nil, invalid("%s changed while it was unpacked: sha256 %s, expected %s", path, got, wantSHA256)
		}
	}
	for _, d := range []string{filepath.Join(partial, UnitsDir), partial} {
		if _, err := os.Lstat(d); err == nil {
			if err := atomicfile.SyncDir(d); err != nil {
				return nil, err
			}
		}
	}
	vm, err := VerifyDir(partial, wantArch)
	if err != nil {
		return nil, fmt.Errorf("unpack %s: verify: %w", path, err)
	}
	return vm, nil
}

// fileReader reads the bundle file, hashing what it reads and keeping the
// file's own read error, so a failing disk is told apart from a corrupt
// bundle.
type fileReader struct {
	r   io.Reader
	h   hash.Hash
	err error
}

func (fr *fileReader) Read(p []byte) (int, error) {
	n, err := fr.r.Read(p)
	fr.h.Write(p[:n])
	if err != nil && err != io.EOF {
		fr.err = err
	}
	return n, err
}

// reader is one strict pass over a bundle's tar stream.
type reader struct {
	ctx  context.Context
	root *os.Root
	src  *fileReader
	lim  Limits

	m     *Manifest
	seen  map[string]bool
	total int64
	buf   []byte
}

func (r *reader) run(wantArch string) (*Manifest, error) {
	br := bufio.NewReaderSize(r.src, 64<<10)
	zr, err := gzip.NewReader(br)
	if err != nil {
		switch {
		case err == io.EOF:
			return nil, invalid("empty file, not a gzip stream")
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, truncated("", err)
		}
		return nil, invalid("not a gzip stream: %v", err)
	}
	tr := tar.NewReader(zr)
	r.seen = map[string]bool{}
	r.buf = make([]byte, 256<<10)
	last := ""
	for {
		if err := context.Cause(r.ctx); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, truncated(last, err)
		}
		if err := r.entry(hdr, tr, wantArch); err != nil {
			return nil, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		last = hdr.Name
	}
	if r.m == nil {
		return nil, invalid("the archive holds no entries; want %s first", ManifestName)
	}
	// Read to the end of the gzip stream: its CRC and length are checked
	// only there, and tar stops at its end-of-archive blocks.
	// What follows the end-of-archive blocks is tar's zero padding; more
	// data there (a second gzip member, say) is refused, not ignored.
	var n int64
	for {
		k, err := zr.Read(r.buf)
		if slices.ContainsFunc(r.buf[:k], func(b byte) bool { return b != 0 }) {
			return nil, invalid("data after the end of the tar archive")
		}
		if n += int64(k); n > maxTrailer {
			return nil, invalid("more than %d bytes after the end of the tar archive", maxTrailer)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, truncated(last, err)
		}
	}
	if _, err := io.Copy(io.Discard, br); err != nil { // hash the rest of the file
		return nil, err
	}
	for _, f := range r.m.Files {
		if !r.seen[f.Path] {
			return nil, invalid("file %s is in the manifest but not in the archive (truncated bundle?)", f.Path)
		}
	}
	return r.m, nil
}

// truncated describes a tar or gzip read error; after names the last good
// entry, if the error is not about one entry already.
func truncated(after string, err error) error {
	where := ""
	if after != "" {
		where = fmt.Sprintf(" after entry %q", after)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return invalid("truncated%s: the file ends inside the archive (%v)", where, err)
	}
	return invalid("corrupt archive%s: %v", where, err)
}

func (r *reader) entry(hdr *tar.Header, tr *tar.Reader, wantArch string) error {
	if r.m == nil {
		return r.manifest(hdr, tr, wantArch)
	}
	name := hdr.Name
	switch hdr.Typeflag {
	case tar.TypeReg:
	case tar.TypeDir:
		name = strings.TrimSuffix(name, "/")
	case tar.TypeSymlink:
		return invalid("symbolic link (to %q): a bundle holds files and the %s/ directory only", hdr.Linkname, UnitsDir)
	case tar.TypeLink:
		return invalid("hard link (to %q): a bundle holds files and the %s/ directory only", hdr.Linkname, UnitsDir)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return invalid("device or FIFO (type %q): a bundle holds files and the %s/ directory only", hdr.Typeflag, UnitsDir)
	default:
		return invalid("entry type %q: a bundle holds files and the %s/ directory only", hdr.Typeflag, UnitsDir)
	}
	if name == UnitsDir && hdr.Typeflag == tar.TypeDir {
		return r.unitsDir(hdr)
	}
	if hdr.Typeflag == tar.TypeDir {
		return invalid("directory %q: the only directory of a bundle is %s/", hdr.Name, UnitsDir)
	}
	if err := checkPath(name); err != nil {
		return invalid("%v", err)
	}
	if r.seen[name] {
		return invalid("%s appears twice", name)
	}
	want, ok := r.m.File(name)
	if !ok {
		return invalid("%s is not in the manifest", name)
	}
	if hdr.Size != want.Size {
		return invalid("size %d, manifest says %d", hdr.Size, want.Size)
	}
	if mode := uint32(hdr.Mode) & 0o7777; mode != want.Mode || hdr.Mode&^0o7777 != 0 {
		return invalid("mode %#o, manifest says %#o", hdr.Mode, want.Mode)
	}
	if r.total += hdr.Size; r.total > r.lim.MaxSize {
		return invalid("unpacked size over the limit of %d bytes (MaxSize)", r.lim.MaxSize)
	}
	r.seen[name] = true
	if dir, _, ok := strings.Cut(name, "/"); ok && !r.seen[dir] {
		// A unit before (or without) the units/ entry: create it.
		if err := r.mkdir(dir); err != nil {
			return err
		}
	}
	return r.file(name, want, tr)
}

// manifest reads the first entry, which must be manifest.json, and checks
// everything that can be checked before any file is written.
func (r *reader) manifest(hdr *tar.Header, tr *tar.Reader, wantArch string) error {
	if hdr.Name != ManifestName || hdr.Typeflag != tar.TypeReg {
		return invalid("the first entry must be the regular file %s", ManifestName)
	}
	if hdr.Size > maxManifest {
		return invalid("%s: %d bytes, over %d", ManifestName, hdr.Size, maxManifest)
	}
	data, err := io.ReadAll(io.LimitReader(tr, maxManifest))
	if err != nil {
		return truncated("", err)
	}
	m, err := decodeManifest(ManifestName, data)
	if err != nil {
		return err
	}
	if err := m.checkRelease(wantArch); err != nil {
		return err
	}
	if total := m.TotalSize(); total > r.lim.MaxSize {
		return invalid("%s lists %d bytes of files, over the limit of %d (MaxSize)", ManifestName, total, r.lim.MaxSize)
	}
	f, err := r.root.OpenFile(ManifestName, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, UnitMode)
	if err != nil {
		return err
	}
	if err := finish(f, data, UnitMode); err != nil {
		return err
	}
	r.m = m
	r.seen[ManifestName] = true
	return nil
}

func (r *reader) unitsDir(hdr *tar.Header) error {
	if r.seen[UnitsDir] {
		return invalid("%s/ appears twice, or after its files", UnitsDir)
	}
	if hdr.Mode&0o7777 != dirMode {
		return invalid("directory %s/: mode %#o, want %#o", UnitsDir, hdr.Mode, dirMode)
	}
	return r.mkdir(UnitsDir)
}

func (r *reader) mkdir(name string) error {
	if err := r.root.Mkdir(name, dirMode); err != nil {
		return err
	}
	if err := r.root.Chmod(name, dirMode); err != nil { // past the umask
		return err
	}
	r.seen[name] = true
	return nil
}

// file writes one listed file, hashing it on the way, and fails as soon as
// the content is not what the manifest says.
func (r *reader) file(name string, want File, tr *tar.Reader) (err error) {
	f, err := r.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	h := sha256.New()
	var n int64
	for n < want.Size {
		if err := context.Cause(r.ctx); err != nil {
			return err
		}
		k, rerr := tr.Read(r.buf[:min(int64(len(r.buf)), want.Size-n)])
		if k > 0 {
			h.Write(r.buf[:k])
			if _, err := f.Write(r.buf[:k]); err != nil {
				return err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return truncated("", rerr)
		}
	}
	if n != want.Size {
		return invalid("truncated: %d of %d bytes", n, want.Size)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != want.SHA256 {
		return invalid("sha256 %s, manifest says %s", sum, want.SHA256)
	}
	err = finish(f, nil, fs.FileMode(want.Mode))
	f = nil
	return err
}

// finish writes data (if any) to f, sets its mode past the umask, syncs and
// closes it.
func finish(f *os.File, data []byte, mode fs.FileMode) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// rename moves the staged tree to dest without replacing anything there:
// rename(2) alone would replace an empty directory created meanwhile.
func rename(partial, dest string) error {
	err := unix.Renameat2(unix.AT_FDCWD, partial, unix.AT_FDCWD, dest, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A filesystem without RENAME_NOREPLACE: check, then rename.
		if _, lerr := os.Lstat(dest); lerr == nil {
			return fmt.Errorf("rename %s to %s: destination exists", partial, dest)
		}
		err = os.Rename(partial, dest)
	}
	if err != nil {
		return fmt.Errorf("rename %s to %s: %w", partial, dest, err)
	}
	return atomicfile.SyncDir(filepath.Dir(dest))
}
