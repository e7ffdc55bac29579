package release

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/units"
)

// maxTemplate bounds one unit template read from a release.
const maxTemplate = 1 << 20

// RenderUnits renders the unit templates of release directory dir (its
// units/) for root. A release without units/ (laid down by Ignition, or
// before releases carried their templates) gets this binary's own
// templates, and builtin says so. A template that is not a regular file
// is refused, never read through.
func RenderUnits(root *hostroot.Root, dir string) (rendered map[string][]byte, builtin bool, err error) {
	udir := filepath.Join(dir, bundle.UnitsDir)
	ents, err := os.ReadDir(udir)
	if errors.Is(err, fs.ErrNotExist) {
		out, err := units.All(units.Vars{Base: root.Base()})
		return out, true, err
	}
	if err != nil {
		return nil, false, err
	}
	tmpl := map[string][]byte{}
	for _, e := range ents {
		b, err := hostroot.ReadRegular(filepath.Join(udir, e.Name()), maxTemplate)
		if err != nil {
			return nil, false, fmt.Errorf("unit template %s: %w", filepath.Join(udir, e.Name()), err)
		}
		tmpl[e.Name()] = b
	}
	out, err := units.RenderFrom(tmpl, units.Vars{Base: root.Base()})
	return out, false, err
}
