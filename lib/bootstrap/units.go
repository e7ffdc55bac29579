package bootstrap

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"slices"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
	"github.com/kubeslot/kubeslot/units"
)

// Watcher is the unit started at the end of a bootstrap (and kept active
// by a complete-host run) when this release has it.
const Watcher = "kubeslot-watcher.service"

// startTimeout bounds starting one unit.
const startTimeout = time.Minute

// Where systemd keeps the units of the nspawn machines, tried in order.
var vendorUnitDirs = []string{"/usr/lib/systemd/system", "/lib/systemd/system"}

// renderedUnits is every kubeslot unit for this host root.
func renderedUnits(root *hostroot.Root) (map[string][]byte, error) {
	return units.All(units.Vars{Base: root.Base()})
}

// installUnits writes every kubeslot unit of this release that differs
// into /etc/systemd/system and enables every unit with an [Install] section,
// each change journalled first (lib/unitinstall). It returns what it
// changed; the caller reloads systemd when that is not empty.
func installUnits(root *hostroot.Root, rec *ownership.Record) ([]string, error) {
	all, err := renderedUnits(root)
	if err != nil {
		return nil, err
	}
	return unitinstall.Install(root, rec, all)
}

// The unit installation helpers live in lib/unitinstall, shared with the
// upgrader; these names keep the bootstrap's code and tests as they were.
var (
	installLinks = unitinstall.Links
	enabled      = unitinstall.Enabled
	ensureLink   = unitinstall.EnsureLink
	localEntry   = unitinstall.LocalEntry
)

// enableMachine makes slot's node start at host boot: the links mode
// names (for nspawn: the instance systemd-nspawn@<slot>.service wanted by
// machines.target, and machines.target wanted by multi-user.target, as
// `machinectl enable` does). Both links are journalled unit changes, so
// reset removes them.
func enableMachine(root *hostroot.Root, rec *ownership.Record, mode isolation.Mode, slot string) (bool, error) {
	changed := false
	target := mode.BootTargetLink()
	links := []isolation.Link{mode.BootLink(slot), target}
	for _, l := range links {
		if l.Path == "" {
			continue
		}
		if l == target {
			// Enabled by the host's own configuration already: leave it.
			if local, err := localEntry(root, l.Path); err == nil {
				if _, err := os.Lstat(local); err == nil {
					continue
				}
			}
		}
		ok, err := ensureLink(root, rec, l.Path, vendorUnit(root, l.Unit))
		if err != nil {
			return changed, fmt.Errorf("enable %s at boot: %w", mode.MachineUnit(slot), err)
		}
		changed = changed || ok
	}
	return changed, nil
}

// vendorUnit is the host path of a unit systemd ships.
func vendorUnit(root *hostroot.Root, name string) string {
	for _, dir := range vendorUnitDirs {
		if local, err := root.Resolve(path.Join(dir, name)); err == nil {
			if _, err := os.Stat(local); err == nil {
				return path.Join(dir, name)
			}
		}
	}
	return path.Join(vendorUnitDirs[0], name)
}

// ensureActive starts every enabled kubeslot unit that is not active
// (except the bootstrap itself, which is this run): the watcher and the
// path units. Best effort: a unit that does not start is logged; it is
// enabled, and the next boot's run tries again. A release without the
// watcher unit is logged as such. On a complete host (repair) each start
// is logged as the repair of what verify's units-state check names.
func ensureActive(ctx context.Context, d Deps, log *slog.Logger, repair bool) []string {
	all, err := renderedUnits(d.Root)
	if err != nil {
		log.Warn("render units", "err", err)
		return nil
	}
	if _, ok := all[Watcher]; !ok {
		log.Warn("this release has no watcher unit yet: not started", "unit", Watcher)
	}
	var started []string
	for _, name := range sortedKeys(all) {
		if name == units.Bootstrap || !enabled(name, all[name]) {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, startTimeout)
		active, _, err := d.Systemd.UnitState(sctx, name)
		if err == nil && active != "active" && active != "activating" && active != "reloading" {
			err = d.Systemd.StartUnit(sctx, name)
			if err == nil {
				started = append(started, name+" started")
				if repair {
					log.Info("repaired", "check", "units-state", "file", name, "field", "ActiveState", "was", active, "did", "started")
				} else {
					log.Info("unit started", "unit", name)
				}
			}
		}
		cancel()
		if err != nil {
			log.Warn("unit not active, and starting it failed; the next run tries again", "unit", name, "err", err)
		}
	}
	return started
}

func sortedKeys(m map[string][]byte) []string { return slices.Sorted(maps.Keys(m)) }
