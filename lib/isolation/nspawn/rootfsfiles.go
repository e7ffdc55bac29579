package nspawn

// Files the host writes into a slot's rootfs: through an os.Root, by rename,
// never through a link the node may have put on the way.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// copyInto copies the local file src to the absolute node path dst inside
// root (mode 0755), replacing what is there by rename.
func copyInto(root *os.Root, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return writeInto(root, dst, in, 0o755)
}

// writeInto writes what in reads to the absolute node path dst inside root
// (mode), replacing what is there by rename: never through a link the
// node may have put on the way.
func writeInto(root *os.Root, dst string, in io.Reader, mode os.FileMode) error {
	name := strings.TrimPrefix(dst, "/")
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	tmp := path.Join(path.Dir(name), "."+path.Base(name)+".kubeslot-tmp")
	_ = root.Remove(tmp)
	out, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Chmod(mode)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("install %s: %w", dst, err)
	}
	return nil
}

// realDir returns the local path of the node directory p (created when
// missing) after checking that no component is a link: unpack.Tar works on
// a local path, which a link in the rootfs could point anywhere.
func realDir(root *os.Root, local, p string) (string, error) {
	cur := ""
	for _, c := range strings.Split(strings.Trim(p, "/"), "/") {
		cur = path.Join(cur, c)
		fi, err := root.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := root.Mkdir(cur, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case !fi.IsDir():
			return "", fmt.Errorf("/%s in the rootfs is a %v, not a directory: refusing to unpack through it", cur, fi.Mode().Type())
		}
	}
	return filepath.Join(local, filepath.FromSlash(cur)), nil
}

// syncfs flushes the filesystem that holds dir.
func syncfs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}
