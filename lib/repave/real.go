package repave

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// vendorUnitDirs are where the host's systemd ships the unit files the boot
// links name (for nspawn, systemd-nspawn@.service).
var vendorUnitDirs = []string{"/usr/lib/systemd/system", "/lib/systemd/system"}

// BootLinks is the real Boot: the enable link that starts a slot's node at
// host boot (Mode.BootLink; for nspawn, systemd-nspawn@<slot>.service in
// machines.target.wants), moved from one slot to the other, journalled in
// the ownership record before it is created (as the bootstrap does).
//
// A move needs no daemon-reload: systemd reads the .wants links when it
// boots, and the target that holds them is already active, so a reload
// would change nothing that runs. One costs PID 1 about half a second of
// CPU (generators, every unit re-read), and commit runs while the new node
// starts its pods (DESIGN.md, "Warm standby").
type BootLinks struct {
	Root   *hostroot.Root
	Record *ownership.Record
	Log    *slog.Logger
	// Mode is the isolation mode whose boot links move; the empty mode is
	// isolation.DefaultMode.
	Mode isolation.Mode
}

func (b *BootLinks) bootLink(slot string) string { return b.Mode.BootLink(slot).Path }

func (b *BootLinks) local(hostPath string) (string, error) {
	dir, err := b.Root.Resolve(path.Dir(hostPath))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, path.Base(hostPath)), nil
}

// Move implements Boot. It is idempotent: a re-run after a crash finds the
// new link in place and the old one gone.
func (b *BootLinks) Move(_ context.Context, from, to string) error {
	fromL, err := b.local(b.bootLink(from))
	if err != nil {
		return err
	}
	toL, err := b.local(b.bootLink(to))
	if err != nil {
		return err
	}
	changed := false
	if _, err := os.Lstat(toL); errors.Is(err, fs.ErrNotExist) {
		target, unit := "", b.Mode.BootLink(to).Unit
		if t, err := os.Readlink(fromL); err == nil {
			target = t
		} else {
			for _, dir := range vendorUnitDirs {
				if l, err := b.Root.Resolve(path.Join(dir, unit)); err == nil {
					if _, err := os.Stat(l); err == nil {
						target = path.Join(dir, unit)
						break
					}
				}
			}
		}
		if target == "" {
			return fmt.Errorf("enable %s at boot: no %s in %v", b.bootLink(to), unit, vendorUnitDirs)
		}
		if _, found := b.Record.Lookup(ownership.KindUnit, b.bootLink(to)); !found {
			prior, err := ownership.CapturePrior(b.Root, b.bootLink(to))
			if err != nil {
				return err
			}
			if err := b.Record.Record(b.Root, ownership.Change{Kind: ownership.KindUnit, Path: b.bootLink(to), Prior: prior}); err != nil {
				return err
			}
		}
		if err := os.MkdirAll(filepath.Dir(toL), 0o755); err != nil {
			return fmt.Errorf("enable %s at boot: %w", b.bootLink(to), err)
		}
		tmp := toL + ".kubeslot-tmp"
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return fmt.Errorf("enable %s at boot: %w", b.bootLink(to), err)
		}
		if err := atomicfile.Rename(tmp, toL); err != nil {
			return fmt.Errorf("enable %s at boot: %w", b.bootLink(to), err)
		}
		changed = true
	} else if err != nil {
		return err
	}
	if _, err := os.Lstat(fromL); err == nil {
		if err := atomicfile.Remove(fromL); err != nil {
			return fmt.Errorf("disable %s at boot: %w", b.bootLink(from), err)
		}
		changed = true
	}
	if changed {
		b.Log.Info("node start at boot moved", "from", b.bootLink(from), "to", b.bootLink(to))
	}
	return nil
}
