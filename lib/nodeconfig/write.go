package nodeconfig

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// WriteFiles writes files into the node rootfs at the local directory
// rootfs and returns the paths it changed. Every path is resolved inside
// rootfs through an os.Root, so a link in the rootfs cannot send a write
// onto the host; each file is replaced by rename (a link at its place is
// replaced, not followed), and one syncfs at the end makes them durable.
// A file whose content and mode are already right is left alone.
func WriteFiles(rootfs string, files []File) (changed []string, err error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("node rootfs: %w", err)
	}
	defer root.Close()
	for _, f := range files {
		ok, err := writeFile(root, f)
		if err != nil {
			return changed, fmt.Errorf("node rootfs %s: %s: %w", rootfs, f.Path, err)
		}
		if ok {
			changed = append(changed, f.Path)
		}
	}
	if len(changed) > 0 {
		if err := syncfs(root); err != nil {
			return changed, fmt.Errorf("node rootfs %s: sync: %w", rootfs, err)
		}
	}
	return changed, nil
}

func rel(p string) (string, error) {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return "", errors.New("want a clean absolute path inside the node")
	}
	return strings.TrimPrefix(p, "/"), nil
}

func writeFile(root *os.Root, f File) (bool, error) {
	name, err := rel(f.Path)
	if err != nil {
		return false, err
	}
	if fi, err := root.Lstat(name); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == f.Mode.Perm() {
		if old, err := readAll(root, name); err == nil && bytes.Equal(old, f.Data) {
			return false, nil
		}
	}
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return false, err
	}
	tmp := path.Join(path.Dir(name), "."+path.Base(name)+".kubeslot-tmp")
	_ = root.Remove(tmp) // left by a crash
	out, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, err
	}
	_, err = out.Write(f.Data)
	if err == nil {
		err = out.Chmod(f.Mode.Perm()) // explicit: the umask must not change it
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return false, err
	}
	return true, nil
}

func readAll(root *os.Root, name string) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxInputFile))
}

// EnsureMachineID gives the node rootfs its own /etc/machine-id unless it
// has a valid one: an empty or "uninitialized" id makes systemd treat every
// boot as the first (presets, firstboot), and an id shared with another slot
// or the host would mix their journals. It returns whether it wrote one.
func EnsureMachineID(rootfs string) (bool, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return false, fmt.Errorf("node rootfs: %w", err)
	}
	defer root.Close()
	if old, err := readAll(root, "etc/machine-id"); err == nil && validMachineID(old) {
		return false, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("node rootfs %s: /etc/machine-id: %w", rootfs, err)
	}
	id := make([]byte, 16)
	rand.Read(id) // never fails
	// Version 4 UUID bits, as systemd-id128 new does.
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	if _, err := writeFile(root, File{"/etc/machine-id", []byte(hex.EncodeToString(id) + "\n"), 0o444}); err != nil {
		return false, fmt.Errorf("node rootfs %s: /etc/machine-id: %w", rootfs, err)
	}
	return true, syncfs(root)
}

func validMachineID(b []byte) bool {
	s := strings.TrimSuffix(string(b), "\n")
	if len(s) != 32 || strings.Trim(s, "0") == "" {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func syncfs(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Syncfs(int(d.Fd()))
}
