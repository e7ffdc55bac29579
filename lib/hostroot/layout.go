package hostroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/exitcode"
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
	if err := r.ensureBase(); err != nil {
		return err
	}
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
			return &LayoutError{File: p, Found: v, Understood: LayoutVersion}
		}
		return nil
	}
	p, err := r.File(LayoutFile)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(p, []byte(strconv.Itoa(LayoutVersion)+"\n"), 0o644)
}

// LayoutError says why a stage refused the host's layout marker: a version
// this release does not understand, or a damaged marker. Stages turn it
// into exit 78 (exitcode.HostUnfit): a retry cannot help, an operator must
// act.
type LayoutError struct {
	File       string // local path of the marker
	Found      int    // the version found; 0 when the marker is damaged
	Understood int    // LayoutVersion
	Damaged    string // the marker's text when it is not a version
}

func (e *LayoutError) Error() string {
	switch {
	case e.Damaged != "":
		return fmt.Sprintf("%s: layout version %q is not a positive integer: the file is damaged; reset the host (kubeslot-resetter --force)", e.File, e.Damaged)
	case e.Found > e.Understood:
		return fmt.Sprintf("%s: layout version %d, this release understands %d: a newer release laid this host out and an older one must not change it; run that release (or a newer one), or reset the host with it", e.File, e.Found, e.Understood)
	default:
		return fmt.Sprintf("%s: layout version %d, this release understands %d: run this release's kubeslot-bootstrap, which migrates the layout, before any other stage", e.File, e.Found, e.Understood)
	}
}

// CheckLayout is every stage's check before it changes anything: nil when
// there is no marker (nothing installed, or a reset finished) or when it
// names LayoutVersion; otherwise a *LayoutError carrying exit 78
// (exitcode.HostUnfit), so that main ends with it and the unit is not
// restarted. A marker that cannot be read is an ordinary error.
func (r *Root) CheckLayout() error {
	v, found, err := r.ReadLayoutVersion()
	var le *LayoutError
	switch {
	case errors.As(err, &le):
		return exitcode.Unfit(err)
	case err != nil || !found || v == LayoutVersion:
		return err
	}
	p, _ := r.File(LayoutFile)
	return exitcode.Unfit(&LayoutError{File: p, Found: v, Understood: LayoutVersion})
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
		return 0, false, &LayoutError{File: p, Understood: LayoutVersion, Damaged: strings.TrimSpace(string(b))}
	}
	return v, true, nil
}
