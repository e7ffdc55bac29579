package slot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
)

// vendorUnitDirs are where the host's systemd ships the unit files the boot
// links name (for nspawn, systemd-nspawn@.service), tried in order.
var vendorUnitDirs = []string{"/usr/lib/systemd/system", "/lib/systemd/system"}

// VendorUnit is the host path of the unit name systemd ships; found is
// false (and the path the first place systemd looks) when there is none.
func VendorUnit(root *hostroot.Root, name string) (p string, found bool) {
	for _, dir := range vendorUnitDirs {
		if local, err := root.Resolve(path.Join(dir, name)); err == nil {
			if _, err := os.Stat(local); err == nil {
				return path.Join(dir, name), true
			}
		}
	}
	return path.Join(vendorUnitDirs[0], name), false
}

// BootLinks are the enable links that start a slot's node at host boot
// (Mode.BootLink; for nspawn, systemd-nspawn@<slot>.service in
// machines.target.wants), written as files, each journalled in the
// ownership record before it exists, so reset removes them.
type BootLinks struct {
	Root   *hostroot.Root
	Record *ownership.Record
	Log    *slog.Logger
	// Mode is the isolation mode whose boot links these are; the empty
	// mode is isolation.DefaultMode.
	Mode isolation.Mode
}

// Enable makes slot's node start at host boot: the links the mode names
// (for nspawn: the instance wanted by machines.target, and machines.target
// wanted by multi-user.target, as `machinectl enable` does). A target the
// host's own configuration enables already is left alone. changed says
// whether a link was written: the caller then reloads systemd.
func (b *BootLinks) Enable(slot string) (changed bool, err error) {
	target := b.Mode.BootTargetLink()
	for _, l := range []isolation.Link{b.Mode.BootLink(slot), target} {
		if l.Path == "" {
			continue
		}
		if l == target {
			if local, err := unitinstall.LocalEntry(b.Root, l.Path); err == nil {
				if _, err := os.Lstat(local); err == nil {
					continue
				}
			}
		}
		unit, _ := VendorUnit(b.Root, l.Unit)
		ok, err := unitinstall.EnsureLink(b.Root, b.Record, l.Path, unit)
		if err != nil {
			return changed, fmt.Errorf("enable %s at boot: %w", b.Mode.MachineUnit(slot), err)
		}
		changed = changed || ok
	}
	return changed, nil
}

// Move makes slot to's node start at host boot and slot from's not, the
// new link naming what the old one did. It is idempotent: a re-run after a
// crash finds the new link in place and the old one gone.
//
// A move needs no daemon-reload: systemd reads the .wants links when it
// boots, and the target that holds them is already active, so a reload
// would change nothing that runs. One costs PID 1 about half a second of
// CPU (generators, every unit re-read), and a repave's commit runs while
// the new node starts its pods.
func (b *BootLinks) Move(_ context.Context, from, to string) error {
	fromPath, toPath := b.Mode.BootLink(from).Path, b.Mode.BootLink(to).Path
	fromL, err := unitinstall.LocalEntry(b.Root, fromPath)
	if err != nil {
		return err
	}
	toL, err := unitinstall.LocalEntry(b.Root, toPath)
	if err != nil {
		return err
	}
	changed := false
	if _, err := os.Lstat(toL); errors.Is(err, fs.ErrNotExist) {
		target, rerr := os.Readlink(fromL)
		if rerr != nil {
			unit := b.Mode.BootLink(to).Unit
			var ok bool
			if target, ok = VendorUnit(b.Root, unit); !ok {
				return fmt.Errorf("enable %s at boot: no %s in %v", toPath, unit, vendorUnitDirs)
			}
		}
		if _, err := unitinstall.EnsureLink(b.Root, b.Record, toPath, target); err != nil {
			return fmt.Errorf("enable %s at boot: %w", toPath, err)
		}
		changed = true
	} else if err != nil {
		return err
	}
	if _, err := os.Lstat(fromL); err == nil {
		if err := atomicfile.Remove(fromL); err != nil {
			return fmt.Errorf("disable %s at boot: %w", fromPath, err)
		}
		changed = true
	}
	if changed {
		b.Log.Info("node start at boot moved", "from", fromPath, "to", toPath)
	}
	return nil
}
