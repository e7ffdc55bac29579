// Package atomicfile writes files, copies and symbolic links so that a crash
// leaves either the old content or the new one, never a mix: a temporary
// file (or link) in the same directory, fsync, rename over the target, fsync
// of the directory.
//
// It works on plain local paths; callers resolve host paths through
// lib/hostroot first. Imported by any package that persists state.
package atomicfile

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile atomically replaces path with data, created with perm. The
// directory must exist. perm is applied explicitly, so the umask cannot widen
// or narrow it: files holding secrets stay 0600.
func WriteFile(path string, data []byte, perm fs.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// WriteJSON atomically replaces path with v as indented JSON and a final
// newline (WriteFile): the shape of every state file kubeslot keeps.
func WriteJSON(path string, v any, perm fs.FileMode) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return WriteFile(path, append(b, '\n'), perm)
}

// CopyFile atomically replaces dst with a copy of src, created with perm
// (applied past the umask) like WriteFile's: through a temporary file in
// dst's directory, synced, renamed over dst, the directory synced. A src
// larger than limit bytes is refused and nothing is left behind.
func CopyFile(src, dst string, perm fs.FileMode, limit int64) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	defer in.Close()
	dir, base := filepath.Split(dst)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			err = fmt.Errorf("copy %s to %s: %w", src, dst, err)
		}
	}()
	n, err := io.Copy(tmp, io.LimitReader(in, limit+1))
	if err != nil {
		return err
	}
	if n > limit {
		return fmt.Errorf("%s: larger than %d bytes", src, limit)
	}
	if err = tmp.Chmod(perm); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	return SyncDir(dir)
}

// Symlink atomically points the link path at target: a link made at a
// temporary name in the same directory (a stale one there is removed
// first) is renamed over path, and the directory synced. A crash leaves
// the old link or the new one, never none.
func Symlink(target, path string) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.Remove(tmp); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	return Rename(tmp, path)
}

// Rename moves oldpath to newpath and makes the move durable by syncing both
// directories. Workers claim request files with it.
func Rename(oldpath, newpath string) error {
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(newpath)); err != nil {
		return err
	}
	if filepath.Dir(oldpath) != filepath.Dir(newpath) {
		return SyncDir(filepath.Dir(oldpath))
	}
	return nil
}

// Remove deletes path (absent is fine) and syncs its directory, so a removal
// that reset or clean-up relies on survives a power loss.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs a directory so that entries created, renamed or removed in
// it are on disk.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
