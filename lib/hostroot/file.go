package hostroot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ErrNotRegular is returned (wrapped) when a file kubeslot reads is a
// symbolic link, a FIFO, a device, a socket or a directory: none is what a
// stage or a person put there, and a FIFO would hang the reader forever.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned (wrapped) when a file is larger than its reader's
// bound: a state file is never that large, and reading it whole could kill
// the process.
var ErrTooLarge = errors.New("larger than allowed")

// OpenRegular opens the local path p (resolved through a Root, or given by a
// person) for reading with no-follow semantics: a symbolic link as its last
// component is refused, not followed out of the root prefix, and so is
// anything but a regular file. It never blocks on a FIFO (O_NONBLOCK). A
// missing file is an error wrapping os.ErrNotExist.
func OpenRegular(p string) (*os.File, error) {
	return openRegular(p, os.O_RDONLY)
}

// OpenRegularFlags is OpenRegular with other open flags (e.g. O_RDWR|O_CREATE
// for a lock file); O_NOFOLLOW and O_NONBLOCK are always added.
func OpenRegularFlags(p string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(p, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, perm)
	if err != nil {
		return nil, refineOpenError(p, err)
	}
	if err := checkRegular(p, f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func openRegular(p string, flag int) (*os.File, error) { return OpenRegularFlags(p, flag, 0) }

func refineOpenError(p string, err error) error {
	if errors.Is(err, syscall.ELOOP) {
		return fmt.Errorf("open %s: %w (a symbolic link; kubeslot does not follow links for its own files)", p, ErrNotRegular)
	}
	if errors.Is(err, syscall.ENXIO) || errors.Is(err, syscall.EOPNOTSUPP) {
		// A socket, or a FIFO with no reader for a write open.
		return fmt.Errorf("open %s: %w", p, ErrNotRegular)
	}
	return err
}

func checkRegular(p string, f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w (%s)", p, ErrNotRegular, describeMode(fi.Mode()))
	}
	return nil
}

func describeMode(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "type " + m.Type().String()
}

// ReadRegular reads the whole regular file p (OpenRegular) if it holds at
// most limit bytes; a larger one is an error wrapping ErrTooLarge, read no
// further than limit+1 bytes.
func ReadRegular(p string, limit int64) ([]byte, error) {
	f, err := OpenRegular(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadLimited(f, p, limit)
}

// ReadLimited reads r to its end if it holds at most limit bytes; name is
// for the error (an error wrapping ErrTooLarge when it holds more).
func ReadLimited(r io.Reader, name string, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("read %s: %w (%d bytes at most)", name, ErrTooLarge, limit)
	}
	return b, nil
}

// OpenInput opens a file a person named (a configuration, a release
// binary): symbolic links are followed, as a person expects, but only a
// regular file is opened, and never by blocking on a FIFO.
func OpenInput(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, refineOpenError(p, err)
	}
	if err := checkRegular(p, f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ReadInput reads the whole file a person named (OpenInput) if it holds at
// most limit bytes.
func ReadInput(p string, limit int64) ([]byte, error) {
	f, err := OpenInput(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadLimited(f, p, limit)
}
