package bootstrap

import (
	"context"
	"fmt"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/migrate"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// movingFrom is the base of an installation the next run would move here
// (migrate.FindLegacy), read without the lock: such a host is not fresh,
// so the checks of a fresh host do not apply. "" when there is none, or
// when it cannot be told (admission decides again under the lock).
func movingFrom(d Deps) string {
	from, err := migrate.FindLegacy(d.Root)
	if err != nil {
		return ""
	}
	return from
}

// migrateLegacy runs in admission, under the installation lock, before the
// record is decided on: when this host's installation lives at another
// base than the one this run was given (migrate.FindLegacy: the installed
// units name it), or a move there is under way, it is moved here
// (migrate.RootMove) and the record read again from its new place, so that
// admission sees a complete installation to verify and repair (units
// rendered for the new base, the stopped watcher and path units started
// again) instead of a fresh host. The node machine keeps running. rec and
// err are what ownership.Load returned at this base; a record here, or an
// error reading it, passes through untouched.
func migrateLegacy(ctx context.Context, d Deps, rec *ownership.Record, err error) (*ownership.Record, error) {
	if err != nil {
		return rec, err
	}
	from, ferr := migrate.FindLegacy(d.Root)
	if ferr != nil {
		return nil, fmt.Errorf("look for an installation at another host root: %w", ferr)
	}
	if from == "" {
		return rec, nil
	}
	old, ferr := hostroot.New(d.Root.Prefix(), from)
	if ferr != nil {
		return nil, ferr
	}
	if lerr := old.CheckLayout(); lerr != nil {
		return nil, fmt.Errorf("installation at %s: %w", from, lerr)
	}
	m := &migrate.RootMove{From: old, To: d.Root, Systemd: d.Systemd, Log: d.Log}
	if merr := m.Run(ctx); merr != nil {
		return nil, fmt.Errorf("move the installation from %s to %s (the next run resumes): %w", from, d.Root.Base(), merr)
	}
	d.Log.Info("installation moved to the configured host root", "from", from, "to", d.Root.Base())
	return ownership.Load(d.Root)
}
