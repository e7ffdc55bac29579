package reset

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/mountinfo"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/units"
)

// workerServices are the kubeslot services a path unit starts; a run that
// waits for the lock is stopped so it does not start on a half-removed host.
// Instances of the worker templates (kubeslot-repave@<slot>.service, any
// slot) are found by pattern among the units systemd has loaded
// (workerPatterns).
var workerServices = []string{"kubeslot-restart.service", "kubeslot-upgrade.service", "kubeslot-reset.service"}

// UnitLister lists the units systemd has loaded whose names match glob
// patterns. The Deps.Systemd of a real run implements it
// (systemdconn.Client); without it only the known instances are stopped.
type UnitLister interface {
	ListUnitsByPatterns(ctx context.Context, patterns []string) ([]string, error)
}

// workerPatterns are the glob patterns of kubeslot's template units'
// instances ("kubeslot-repave@.service" → "kubeslot-repave@*.service").
func workerPatterns() []string {
	var out []string
	for _, n := range units.Names() {
		if prefix, suffix, ok := strings.Cut(n, "@."); ok {
			out = append(out, prefix+"@*."+suffix)
		}
	}
	return out
}

// workers lists the worker units to stop: the fixed services, the repave
// template's well-known instance, and every loaded instance of a template.
func (r *runner) workers(ctx context.Context) ([]string, error) {
	names := append([]string(nil), workerServices...)
	names = append(names, "kubeslot-repave@next.service")
	if l, ok := r.d.Systemd.(UnitLister); ok {
		uctx, cancel := context.WithTimeout(ctx, unitWait)
		loaded, err := l.ListUnitsByPatterns(uctx, workerPatterns())
		cancel()
		if err != nil {
			return nil, err
		}
		names = append(names, loaded...)
	} else {
		r.log.Warn("cannot list the loaded units: stopping only the known worker instances")
	}
	slices.Sort(names)
	// kubeslot-reset.service only hands a request over (Run), so it is
	// stopped like any worker; the resetting unit, which may be this run,
	// never matches these names.
	return slices.Compact(names), nil
}

func (r *runner) markResetting(ctx context.Context) error {
	if r.rec.Checkpoint == ownership.CheckpointResetting {
		return nil
	}
	if err := r.rec.SetCheckpoint(ownership.CheckpointResetting); err != nil {
		return err
	}
	return ownership.Save(r.d.Root, r.rec)
}

// reportRequest writes the request's final status first, because after the
// watcher is stopped nobody publishes it, and waits (bounded) until the
// watcher has published it. A request-mode run resumed after a kill in this
// step finds no claimed request (Finish ran): it waits for the status it
// wrote before the kill instead.
// reportFailure writes the AgentReset request's Failed status when step s
// failed before the request was reported (request path): the watcher, still
// running, publishes it, and the claim is finished so that the failure is
// not retried unattended. The host stays marked resetting; a person fixes
// what the message names and runs kubeslot-resetter. Best effort.
func (r *runner) reportFailure(s Step, err error) {
	if !r.d.Request || r.req == nil || r.reported {
		return
	}
	st := &requests.Status{RequestID: r.req.ID, Kind: requests.Reset, Operation: r.req.Operation,
		MachineGeneration: r.req.MachineGeneration, Phase: requests.Failed,
		Message: fmt.Sprintf("reset failed at step %s (%s): %v; the host is partly reset: fix the cause, then run kubeslot-resetter on it", s.Name, s.What, err)}
	dir := requests.New(r.d.Root)
	if werr := dir.WriteStatus(st); werr != nil {
		r.log.Warn("could not report the failed reset", "err", werr)
		return
	}
	if ferr := dir.Finish(r.lock, requests.Reset); ferr != nil && !isNotExist(ferr) {
		r.log.Warn("could not finish the failed reset request", "err", ferr)
	}
}

func (r *runner) reportRequest(ctx context.Context) error {
	if !r.d.Request {
		return nil
	}
	dir := requests.New(r.d.Root)
	id := ""
	if r.req != nil {
		id = r.req.ID
		now := time.Now().UTC()
		st := &requests.Status{RequestID: r.req.ID, Kind: requests.Reset, Operation: r.req.Operation,
			MachineGeneration: r.req.MachineGeneration, Phase: requests.Succeeded,
			Message: "kubeslot is being removed from this host; this is the last report it sends",
			Phases:  []requests.PhaseTiming{{Name: "reset", StartedAt: now}}}
		if err := dir.WriteStatus(st); err != nil {
			return err
		}
		r.reported = true
		if err := dir.Finish(r.lock, requests.Reset); err != nil && !isNotExist(err) {
			return err
		}
	} else {
		id = r.unpublishedReset(dir)
		if id == "" {
			return nil
		}
	}
	active, _, err := r.d.Systemd.UnitState(ctx, units.Watcher)
	if err != nil || (active != "active" && active != "activating" && active != "reloading") {
		r.log.Warn("the watcher is not running: the reset's result is not published", "state", active, "err", err)
		return nil
	}
	// The lock is let go while waiting: a watcher started after this run
	// (a boot in the middle of the reset) needs it for its start-up before
	// it publishes anything. Every other stage refuses a host marked
	// resetting, and the path units and the first-boot unit are gone.
	published := false
	lctx, cancel := context.WithTimeout(ctx, r.d.wait(r.d.LockWait, DefaultLockWait))
	defer cancel()
	if err := r.lock.Yield(lctx, func() { published = r.waitPublished(ctx, dir, id) }); err != nil {
		return fmt.Errorf("take the installation lock back after waiting for the watcher: %w", err)
	}
	if !published && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// waitPublished waits (bounded by PublishWait) until the watcher has
// published the result of request id.
func (r *runner) waitPublished(ctx context.Context, dir *requests.Dir, id string) bool {
	bound := r.d.wait(r.d.PublishWait, DefaultPublishWait)
	deadline := time.Now().Add(bound)
	for {
		p, err := dir.LoadPublished()
		if err == nil && p[id] == requests.Succeeded {
			r.log.Info("the watcher published the reset's result", "request", id)
			return true
		}
		if time.Now().After(deadline) {
			r.log.Warn("the watcher did not publish the reset's result in time; going on", "request", id, "waited", bound)
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// unpublishedReset is the ID of a Succeeded reset status the watcher has
// not published yet, or "".
func (r *runner) unpublishedReset(dir *requests.Dir) string {
	sts, _, err := dir.ListStatus()
	if err != nil {
		return ""
	}
	pub, err := dir.LoadPublished()
	if err != nil {
		return ""
	}
	for _, st := range sts {
		if st.Kind == requests.Reset && st.Phase == requests.Succeeded && pub[st.RequestID] != requests.Succeeded {
			return st.RequestID
		}
	}
	return ""
}

func (r *runner) stopWatcher(ctx context.Context) error { return r.stopUnit(ctx, units.Watcher) }

// stopUnits stops the path units, the recovery unit and waiting workers
// (never the reset service this run may be), then removes the path units'
// enablement links.
func (r *runner) stopUnits(ctx context.Context) error {
	var names []string
	for _, k := range requests.Kinds() {
		names = append(names, units.PathUnit(string(k)))
	}
	names = append(names, units.Recovery)
	workers, err := r.workers(ctx)
	if err != nil {
		return err
	}
	names = append(names, workers...)
	for _, n := range names {
		if err := r.stopUnit(ctx, n); err != nil {
			return err
		}
	}
	changed, err := r.undoGroup(ctx, StepStopUnits)
	if err != nil {
		return err
	}
	for _, k := range requests.Kinds() {
		c, err := r.removeLinks(units.PathUnit(string(k)))
		if err != nil {
			return err
		}
		changed = changed || c
	}
	return r.reloadIf(ctx, changed)
}

// stopMachines stops the node machine of every slot the journal shows
// kubeslot made, or the host root's applied state names, gracefully and
// bounded, terminating it if that fails.
func (r *runner) stopMachines(ctx context.Context) error {
	for _, slot := range r.machineSlots() {
		if err := r.stopMachine(ctx, slot); err != nil {
			return err
		}
		// A layered slot's rootfs is an overlay mounted by its own unit:
		// unmounted now, so that remove-rootfs finds a plain directory. Not
		// while something else is mounted inside it: systemd would unmount
		// that too (a person's mount, a tmpfs and its data); the overlay
		// stays, and remove-rootfs refuses, naming the mounts.
		if unit := isolation.DefaultMode.RootfsMountUnit(slot); unit != "" {
			if nested, err := r.mountsInside(slot); err != nil {
				return err
			} else if len(nested) > 0 {
				r.log.Warn("mounts inside the slot's rootfs: its overlay is left mounted", "slot", slot, "mounts", nested)
				continue
			}
			if err := r.d.Systemd.StopUnit(ctx, unit); err != nil {
				return fmt.Errorf("unmount the rootfs of slot %s: %w", slot, err)
			}
		}
	}
	return nil
}

// mountsInside lists the mount points strictly inside slot's rootfs (the
// rootfs's own mount is not one of them).
func (r *runner) mountsInside(slot string) ([]string, error) {
	local, err := r.d.Root.Entry(path.Join(hostroot.MachinesDir, slot))
	if err != nil {
		return nil, err
	}
	all, err := mountinfo.Under(local)
	if err != nil {
		return nil, err
	}
	var inside []string
	for _, m := range all {
		if m != local {
			inside = append(inside, m)
		}
	}
	return inside, nil
}

// machineSlots are the slots whose node machine a reset stops: those of the
// journal, and those <base>/applied/ names (kubeslot's own directory), which
// a forced reset of a salvaged record may be all that is left of them.
// Stopping a machine changes no file: the journal stays the only authority
// on what is removed outside the base.
func (r *runner) machineSlots() []string {
	slots := slotsOf(r.rec)
	dir, err := r.d.Root.Path(hostroot.AppliedDir)
	if err != nil {
		return slots
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		slot, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !e.Type().IsRegular() || !slotNameRE.MatchString(slot) || slices.Contains(slots, slot) {
			continue
		}
		slots = append(slots, slot)
	}
	slices.Sort(slots)
	return slots
}

// slotNameRE keeps what is read from file names to plain slot names.
var slotNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// machineUnit is the host unit that runs slot's node. A reset reads no
// configuration, so it names the unit of the default mode, the only one
// this release operates.
func machineUnit(slot string) string { return isolation.DefaultMode.MachineUnit(slot) }

func (r *runner) stopMachine(ctx context.Context, slot string) error {
	unit := machineUnit(slot)
	active, _, err := r.d.Systemd.UnitState(ctx, unit)
	if err != nil {
		return fmt.Errorf("stop the node of slot %s: %w", slot, err)
	}
	_, merr := r.d.Systemd.Machine(ctx, slot)
	running := merr == nil
	if merr != nil && !isNoMachine(merr) {
		return fmt.Errorf("stop the node of slot %s: %w", slot, merr)
	}
	if !running && (active == "inactive" || active == "failed" || active == "") {
		_ = r.d.Systemd.ResetFailed(ctx, unit)
		return nil
	}
	t0 := time.Now()
	bound := r.d.wait(r.d.StopWait, DefaultStopWait)
	sctx, cancel := context.WithTimeout(ctx, bound)
	stopErr := r.d.Systemd.StopUnit(sctx, unit)
	cancel()
	if stopErr == nil {
		stopErr = r.waitGone(ctx, slot)
	}
	if stopErr != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("stop %s: %w", unit, stopErr)
		}
		r.log.Warn("graceful stop failed; terminating the machine", "slot", slot, "err", stopErr)
		if err := r.d.Systemd.TerminateMachine(ctx, slot); err != nil && !isNoMachine(err) {
			return fmt.Errorf("stop %s: %v; terminate machine %s: %w", unit, stopErr, slot, err)
		}
		if err := r.waitGone(ctx, slot); err != nil {
			return fmt.Errorf("stop %s: %v; machine %s still there after terminate: %w", unit, stopErr, slot, err)
		}
	}
	_ = r.d.Systemd.ResetFailed(ctx, unit)
	r.log.Info("node machine stopped", "slot", slot, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

func (r *runner) waitGone(ctx context.Context, slot string) error {
	deadline := time.Now().Add(goneWait)
	for {
		_, err := r.d.Systemd.Machine(ctx, slot)
		if isNoMachine(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("machine %s still registered after %s", slot, goneWait)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (r *runner) removeNspawn(ctx context.Context) error {
	changed, err := r.undoGroup(ctx, StepRemoveNspawn)
	if err != nil {
		return err
	}
	return r.reloadIf(ctx, changed)
}

func (r *runner) removeRootfs(ctx context.Context) error {
	_, err := r.undoGroup(ctx, StepRemoveRootfs)
	return err
}

func (r *runner) undoJournal(ctx context.Context) error {
	changed, err := r.undoGroup(ctx, StepUndoJournal)
	if err != nil {
		return err
	}
	return r.reloadIf(ctx, changed)
}

// removeBootstrapUnit stops the first-boot unit, removes its enablement
// links and its file (restoring a journalled prior state), then reloads:
// from here on, nothing bootstraps the host at boot.
func (r *runner) removeBootstrapUnit(ctx context.Context) error {
	if err := r.stopUnit(ctx, units.Bootstrap); err != nil {
		return err
	}
	changed, err := r.undoGroup(ctx, StepRemoveBootstrapUnit)
	if err != nil {
		return err
	}
	c, err := r.removeUnitByName(units.Bootstrap)
	if err != nil {
		return err
	}
	return r.reloadIf(ctx, changed || c)
}

// removeUnits removes every kubeslot unit file and its links, then the
// directories kubeslot made for them, reloads systemd and clears the units'
// failed state.
func (r *runner) removeUnits(ctx context.Context) error {
	changed, err := r.undoGroup(ctx, StepRemoveUnits)
	if err != nil {
		return err
	}
	for _, n := range units.Names() {
		c, err := r.removeUnitByName(n)
		if err != nil {
			return err
		}
		changed = changed || c
	}
	if err := r.reloadIf(ctx, changed); err != nil {
		return err
	}
	for _, n := range units.Names() {
		if !strings.Contains(n, "@.") {
			_ = r.d.Systemd.ResetFailed(ctx, n)
		}
	}
	return nil
}

// removeHostRoot removes everything in the base but the ownership record
// and the resetter's copy the resetting unit runs, which go last.
func (r *runner) removeHostRoot(ctx context.Context) error {
	base, err := r.base()
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(base)
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", base, err)
	}
	if m, err := mountinfo.Under(base); err != nil {
		return err
	} else if len(m) > 0 {
		return fmt.Errorf("%s: mount points inside (%s): unmount them, then run kubeslot-resetter again", base, strings.Join(m, ", "))
	}
	for _, e := range ents {
		if e.Name() == hostroot.OwnershipFile || e.Name() == hostroot.ResettingDir || e.Name() == hostroot.ParentsFile {
			continue
		}
		if err := os.RemoveAll(filepath.Join(base, e.Name())); err != nil {
			return fmt.Errorf("remove %s: %w", filepath.Join(base, e.Name()), err)
		}
	}
	r.log.Info("host root removed", "base", r.d.Root.Base())
	return atomicfile.SyncDir(base)
}

// removeRecord removes the record, then the resetting unit with the copy
// it runs and the base: with the record gone, a run of that unit finds
// nothing under way and only removes itself.
func (r *runner) removeRecord(ctx context.Context) error {
	if err := ownership.Remove(r.d.Root); err != nil {
		return err
	}
	return removeResetting(ctx, r.d, r.log)
}

// base resolves the host root, refusing one that is a system directory
// (a mistaken --host-root must not make reset delete /opt).
func (r *runner) base() (string, error) {
	b := r.d.Root.Base()
	if slices.Contains(systemDirs, b) {
		return "", fmt.Errorf("host root %s is a system directory: refusing to remove it; remove kubeslot's files by hand", b)
	}
	return r.d.Root.Resolve(b)
}

var systemDirs = hostroot.SystemDirs

// removeEmptyBase removes the base directory when it is empty (what a
// reset killed between removing the record and the directory leaves too),
// then the directories kubeslot made above it (hostroot.ParentsFile), the
// innermost first, each only if empty and never a system directory.
func removeEmptyBase(root *hostroot.Root, log interface{ Info(string, ...any) }) error {
	if slices.Contains(systemDirs, root.Base()) {
		return nil
	}
	base, err := root.Resolve(root.Base())
	if err != nil {
		return err
	}
	// Empty but for the list of what was made above it.
	ents, err := os.ReadDir(base)
	if isNotExist(err) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", base, err)
	}
	for _, e := range ents {
		if e.Name() != hostroot.ParentsFile {
			return nil
		}
	}
	parents, err := root.LoadParents()
	if err != nil { // a damaged list must not keep the reset from its end
		log.Info("directories made above the host root not removed", "err", err.Error())
		parents = nil
	}
	if err := root.SaveParents(nil); err != nil {
		return err
	}
	if removed, err := hostroot.RemoveEmptyDir(base); err != nil || !removed {
		return err
	}
	log.Info("empty host root removed", "base", root.Base())
	removed, err := root.RemoveParents(parents)
	for _, p := range removed {
		log.Info("directory made above the host root removed", "path", p)
	}
	return err
}

// stopUnit stops a unit if it is active; an unknown or inactive unit is
// success.
func (r *runner) stopUnit(ctx context.Context, name string) error {
	uctx, cancel := context.WithTimeout(ctx, unitWait)
	defer cancel()
	active, _, err := r.d.Systemd.UnitState(uctx, name)
	if err != nil {
		return fmt.Errorf("state of %s: %w", name, err)
	}
	switch active {
	case "inactive", "failed", "":
		_ = r.d.Systemd.ResetFailed(uctx, name)
		return nil
	}
	if err := r.d.Systemd.StopUnit(uctx, name); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	r.log.Info("unit stopped", "unit", name)
	return nil
}

func (r *runner) reloadIf(ctx context.Context, changed bool) error {
	if !changed {
		return nil
	}
	uctx, cancel := context.WithTimeout(ctx, unitWait)
	defer cancel()
	return r.d.Systemd.Reload(uctx)
}

// sync flushes the filesystems a reset touches (syncfs on each one once).
func (r *runner) sync() error {
	seen := map[uint64]bool{}
	for _, p := range []string{"/", hostroot.UnitDir, hostroot.MachinesDir, path.Dir(r.d.Root.Base())} {
		local, err := r.d.Root.Resolve(p)
		if err != nil {
			return err
		}
		f, err := os.Open(local)
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err == nil && !seen[st.Dev] {
			seen[st.Dev] = true
			if err := unix.Syncfs(int(f.Fd())); err != nil {
				f.Close()
				return fmt.Errorf("syncfs %s: %w", local, err)
			}
		}
		f.Close()
	}
	return nil
}
