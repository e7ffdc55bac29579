package reset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/units"
)

// The resetting unit (units.Resetting) carries a reset through whatever
// interrupts the run that started it. Every unit file and binary of the
// installation goes during a reset, so the run that does the work must not
// depend on them: it runs a copy of the resetter kept in <base>/resetting/
// (kept by remove-host-root, removed by remove-record), from a unit file
// that only the reset's last act removes. systemd starts it again after a
// kill and at boot after a power cut; with --resume it finishes the reset
// and never starts one.

// resettingBinary is the copy's file name in hostroot.ResettingDir.
const resettingBinary = "kubeslot-resetter"

// resettingLink is the host path of the unit's enablement link.
func resettingLink() string {
	return path.Join(hostroot.UnitDir, units.ResettingWantedBy+".wants", units.Resetting)
}

// installResetting (step install-resetting-unit) copies the running
// resetter into <base>/resetting/ unless a copy is there (never replaced:
// the unit may be running it), writes the unit file, enables it and
// reloads systemd when anything changed.
func (r *runner) installResetting(ctx context.Context) error {
	dir, err := r.d.Root.Path(hostroot.ResettingDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	changed := false
	dst := filepath.Join(dir, resettingBinary)
	if _, err := os.Lstat(dst); isNotExist(err) {
		if r.d.Self == "" {
			return errors.New("reset: the path of the running resetter (Deps.Self) is unknown: cannot install " + units.Resetting)
		}
		if err := atomicfile.CopyFile(r.d.Self, dst, 0o755, maxResetter); err != nil {
			return fmt.Errorf("copy the resetter: %w", err)
		}
		changed = true
	} else if err != nil {
		return err
	}
	data, err := units.RenderResetting(units.Vars{Base: r.d.Root.Base()}, r.d.Request)
	if err != nil {
		return err
	}
	unitPath, err := r.d.Root.Unit(units.Resetting)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(unitPath); err != nil || !bytes.Equal(old, data) {
		if err := os.MkdirAll(filepath.Dir(unitPath), 0o755); err != nil {
			return err
		}
		if err := atomicfile.WriteFile(unitPath, data, 0o644); err != nil {
			return err
		}
		changed = true
	}
	link, err := localEntry(r.d.Root, resettingLink())
	if err != nil {
		return err
	}
	target := path.Join(hostroot.UnitDir, units.Resetting)
	if cur, err := os.Readlink(link); err != nil || cur != target {
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		if err := atomicfile.Symlink(target, link); err != nil {
			return fmt.Errorf("enable %s: %w", units.Resetting, err)
		}
		changed = true
	}
	if changed {
		r.log.Info("resetting unit installed: a kill or a power cut from here on is finished by it", "unit", units.Resetting)
	}
	return r.reloadIf(ctx, changed)
}

// maxResetter bounds the resetter's copy of itself (Go binaries are tens
// of MiB).
const maxResetter = 1 << 30

// removeResetting removes the resetter's copy, then the empty base, then
// the unit's link and file, and reloads systemd. The copy goes first: a run
// killed after that is not restarted into the work again, and the unit's
// ExecStopPost= takes the copy's absence as "done" and removes the rest.
// Also run when no reset is under way, to clear what an interrupted end of
// one left. It needs no record.
func removeResetting(ctx context.Context, d Deps, log interface{ Info(string, ...any) }) error {
	dir, err := d.Root.Path(hostroot.ResettingDir)
	if err != nil {
		return err
	}
	changed := false
	if _, err := os.Lstat(dir); err == nil {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove %s: %w", dir, err)
		}
		if err := atomicfile.SyncDir(filepath.Dir(dir)); err != nil {
			return err
		}
		changed = true
	}
	if err := removeEmptyBase(d.Root, log); err != nil {
		return err
	}
	for _, p := range []string{resettingLink(), path.Join(hostroot.UnitDir, units.Resetting)} {
		local, err := localEntry(d.Root, p)
		if err != nil {
			return err
		}
		if _, err := os.Lstat(local); isNotExist(err) {
			continue
		}
		if err := atomicfile.Remove(local); err != nil {
			return fmt.Errorf("remove %s: %w", p, err)
		}
		changed = true
	}
	if !changed {
		return nil
	}
	log.Info("resetting unit removed", "unit", units.Resetting)
	uctx, cancel := context.WithTimeout(ctx, unitWait)
	defer cancel()
	return d.Systemd.Reload(uctx)
}

// handOver is what kubeslot-reset.service does with an AgentReset request:
// it marks the host resetting, installs the resetting unit and starts it,
// which claims the request and does the work. A bad request file is moved
// aside (SweepRefused) and never handed over.
func (r *runner) handOver(ctx context.Context, res *Result) error {
	dir := requests.New(r.d.Root)
	refused, err := dir.SweepRefused(r.lock, requests.Reset)
	if err != nil {
		return fmt.Errorf("check the reset request: %w", err)
	}
	for _, f := range refused {
		r.log.Warn("reset request refused and moved aside", "file", f.File, "moved_to", f.MovedTo, "request", f.RequestID, "reason", f.Reason)
	}
	req, err := dir.Claimed(requests.Reset)
	if err == nil && req == nil {
		req, err = dir.Pending(requests.Reset)
	}
	if err != nil {
		return fmt.Errorf("read the reset request: %w", err)
	}
	if req == nil && !res.Resumed {
		if len(refused) > 0 {
			r.log.Info("nothing run: the reset request was refused and moved aside")
			res.Nothing = true
			return nil
		}
		r.log.Info("no reset request to serve: nothing done (run kubeslot-resetter by hand to reset anyway)")
		res.Nothing = true
		return nil
	}
	if req != nil {
		res.RequestID = req.ID
	}
	active, _, err := r.d.Systemd.UnitState(ctx, units.Resetting)
	if err != nil {
		return fmt.Errorf("state of %s: %w", units.Resetting, err)
	}
	if active == "active" || active == "activating" || active == "deactivating" || active == "reloading" {
		// The path unit starts this worker again while the request waits
		// to be claimed; deferring pauses it (the unit's ExecStopPost=).
		return exitcode.Defer(fmt.Errorf("the reset is under way in %s", units.Resetting))
	}
	if _, err := r.runSteps(ctx, StepsFor(true)[:2]); err != nil {
		return err
	}
	uctx, cancel := context.WithTimeout(ctx, unitWait)
	defer cancel()
	if err := r.d.Systemd.StartUnit(uctx, units.Resetting); err != nil {
		return fmt.Errorf("hand the reset over to %s: %w", units.Resetting, err)
	}
	r.log.Info("reset handed over", "unit", units.Resetting, "request", res.RequestID)
	res.HandedOver = true
	return nil
}
