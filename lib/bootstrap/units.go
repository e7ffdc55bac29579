package bootstrap

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
	"github.com/kubeslot/kubeslot/units"
)

// Watcher is the unit started at the end of a bootstrap (and kept active
// by a complete-host run) when this release has it.
const Watcher = "kubeslot-watcher.service"

// startTimeout bounds starting one unit.
const startTimeout = time.Minute

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
)

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
