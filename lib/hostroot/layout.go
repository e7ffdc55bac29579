package hostroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
)

// LayoutVersion is the version of the host layout this release writes. A
// later release that changes the layout reads the marker and migrates.
const LayoutVersion = 1

// layoutDirs are created by EnsureLayout with these modes (DESIGN.md, "Host
// layout"). 0700 where a directory may hold secrets or requests that only
// root may drop.
var layoutDirs = []struct {
	name string
	mode fs.FileMode
}{
	{"", 0o755},
	{AppliedDir, 0o700},
	{RequestsDir, 0o700},
	{StatusDir, 0o700},
	{StateDir, 0o700},
	{CacheDir, 0o755},
	{IdentityDir, 0o700},
	{ReleasesDir, 0o755},
}

// EnsureLayout creates kubeslot's base tree and writes the layout marker if
// missing. It refuses a tree whose marker names another layout version, so
// an old release never writes into a layout it does not understand.
func (r *Root) EnsureLayout() error {
	for _, d := range layoutDirs {
		p, err := r.Path(d.name)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(p, d.mode); err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	v, found, err := r.ReadLayoutVersion()
	if err != nil {
		return err
	}
	if found {
		if v != LayoutVersion {
			p, _ := r.File(LayoutFile)
			return fmt.Errorf("%s: layout version %d, this release understands %d: run the matching release or reset the host", p, v, LayoutVersion)
		}
		return nil
	}
	p, err := r.File(LayoutFile)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(p, []byte(strconv.Itoa(LayoutVersion)+"\n"), 0o644)
}

// ReadLayoutVersion reads the layout marker; found is false when there is
// none (no installation yet).
func (r *Root) ReadLayoutVersion() (version int, found bool, err error) {
	p, err := r.File(LayoutFile)
	if err != nil {
		return 0, false, err
	}
	b, err := ReadRegular(p, 64)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read %s: %w", p, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v < 1 {
		return 0, false, fmt.Errorf("%s: layout version %q is not a positive integer: the file is damaged; reset the host", p, strings.TrimSpace(string(b)))
	}
	return v, true, nil
}
