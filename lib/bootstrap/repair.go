package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
	"github.com/kubeslot/kubeslot/lib/verify"
)

// The repair of a complete host (every boot) acts on lib/verify's
// findings, the same checks `kubeslot verify` prints, so the two agree:
// each finding is repaired, logged as one "repaired" line (check, file,
// field, what was wrong, what was done), or left, logged as one "not
// repaired" line with the reason. Nothing a finding does not name is
// touched, with two boot duties that are no verify check: host preparation
// is applied again (swap the host's fstab brings back at boot goes off
// again) and the slot's lifecycle hooks are ensured. Unit files and links
// are written through lib/unitinstall, so every change outside the host
// root is journalled before it is made, as at installation.

// repairer carries one repair run.
type repairer struct {
	d       Deps
	rec     *ownership.Record
	applied *state.Applied
	log     *slog.Logger
	// done lists what was repaired (Result.Repaired); reload says a unit
	// file or link changed.
	done   []string
	reload bool
}

// verifySystemd is what the repair asks systemd beyond Deps.Systemd: the
// real client (lib/systemdconn) has it; a connection without it skips the
// checks that need it.
type verifySystemd interface {
	isolation.SystemdConn
	UnitFileState(ctx context.Context, name string) (string, error)
}

func (r *repairer) verify(ctx context.Context) *verify.Report {
	vd := verify.Deps{Root: r.d.Root, Now: r.d.Now,
		NoSystemd: "the bootstrap's systemd connection cannot tell unit file states"}
	if sd, ok := r.d.Systemd.(verifySystemd); ok {
		vd.Systemd = sd
	}
	return verify.Run(ctx, vd)
}

func (r *repairer) repaired(check string, f verify.Finding, did string) {
	r.log.Info("repaired", "check", check, "file", f.File, "field", f.Field, "was", f.Value, "did", did)
	r.done = append(r.done, f.File+": "+did)
}

func (r *repairer) left(check string, f verify.Finding, why string) {
	r.log.Warn("not repaired", "check", check, "file", f.File, "field", f.Field, "was", f.Value, "reason", why)
}

// repair is the run on a complete host (see above), from the APPLIED
// configuration; Run then starts the enabled units that are not active.
func repair(ctx context.Context, d Deps, rec *ownership.Record) ([]string, error) {
	log := d.Log.With("install_id", rec.InstallID)
	applied, err := state.NewStore(d.Root).ActiveApplied()
	if err != nil {
		return nil, fmt.Errorf("complete installation: %w", err)
	}
	if applied == nil {
		return nil, fmt.Errorf("complete installation %s has no active slot in %s: the host root is damaged; reset the host", rec.InstallID, d.Root.HostPath(hostroot.AppliedDir))
	}
	if err := d.Host.Apply(ctx, applied.Config, rec); err != nil {
		return nil, err
	}
	r := &repairer{d: d, rec: rec, applied: applied, log: log}
	rep := r.verify(ctx)
	// The release first: the unit files are what current renders.
	if c := find(rep, verify.CheckCurrent); c.Status == verify.Problem {
		did, err := r.current(ctx, c)
		if err != nil {
			return r.done, err
		}
		rep = r.verify(ctx)
		after := find(rep, verify.CheckCurrent).Findings
		for _, f := range c.Findings {
			if !slices.ContainsFunc(after, func(a verify.Finding) bool { return a.File == f.File && a.Field == f.Field }) {
				r.repaired(verify.CheckCurrent, f, did)
			}
		}
		for _, f := range after {
			r.left(verify.CheckCurrent, f, "a release's files are not rewritten in place, and current could not be pointed at a release that verifies: "+
				"install the release again (an agent upgrade with its bundle), or reset the host")
		}
	}
	r.lastGood(rep)
	if err := r.unitFiles(ctx, find(rep, verify.CheckUnitFiles)); err != nil {
		return r.done, err
	}
	mode, err := isolation.AppliedMode(applied)
	if err != nil {
		return r.done, err
	}
	if err := r.machine(ctx, find(rep, verify.CheckMachine), mode); err != nil {
		return r.done, err
	}
	r.unitsState(find(rep, verify.CheckUnitsState))
	if r.reload {
		if err := d.Systemd.Reload(ctx); err != nil {
			return r.done, err
		}
	}
	for _, name := range []string{verify.CheckApplied, verify.CheckIdentity} {
		for _, f := range find(rep, name).Findings {
			r.left(name, f, leftReason[name])
		}
	}
	_, op, err := d.NewIsolation(applied.Config, rec)
	if err != nil {
		return r.done, fmt.Errorf("applied configuration of slot %s: %w", applied.Slot, err)
	}
	if err := op.EnsureHooks(ctx); err != nil {
		return r.done, err
	}
	log.Debug("complete installation checked", "slot", applied.Slot, "verdict", rep.Verdict, "repaired", r.done)
	return r.done, nil
}

// leftReason says why the findings of a check are never repaired.
var leftReason = map[string]string{
	verify.CheckApplied: "the applied configuration and the commit point are written only by a verified bootstrap or repave, never rebuilt from a guess: " +
		"a repave writes them again; a damaged active slot needs a reset",
	verify.CheckIdentity: "the node's identity needs a re-join, which kubeslot does not do on its own: " +
		"reset the host and bootstrap it again with a valid join token in the configuration",
}

// find is the named check of rep (a zero Result when absent).
func find(rep *verify.Report, name string) verify.Result {
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	return verify.Result{Name: name}
}

// current repairs the current link: one that names a release directory by
// another spelling (an absolute path) is written again relative; any other
// problem goes to the Releaser (lib/release.Ensure: back to last-good, or
// this release installed again, when current does not run). It says what
// it did; the caller verifies again to see what that repaired.
func (r *repairer) current(ctx context.Context, c verify.Result) (string, error) {
	if slices.ContainsFunc(c.Findings, func(f verify.Finding) bool { return f.Field == "target" }) {
		if name := r.releaseNamed(); name != "" {
			if err := release.SetCurrent(r.d.Root, name); err != nil {
				return "", err
			}
			return "pointed at " + path.Join(hostroot.ReleasesDir, name), nil
		}
	}
	if err := r.d.Releaser.Ensure(ctx); err != nil {
		return "", fmt.Errorf("repair %s: %w", r.d.Root.HostPath(hostroot.CurrentLink), err)
	}
	name, _ := release.Current(r.d.Root)
	return "release made usable (lib/release.Ensure): current names " + path.Join(hostroot.ReleasesDir, name), nil
}

// releaseNamed is the release directory the current link resolves to when
// it is spelled other than releases/<name> (an absolute path into the
// base), "" otherwise.
func (r *repairer) releaseNamed() string {
	base, err := r.d.Root.Path()
	if err != nil {
		return ""
	}
	target, err := os.Readlink(filepath.Join(base, hostroot.CurrentLink))
	if err != nil || !path.IsAbs(target) {
		return ""
	}
	for _, n := range release.Names {
		if path.Clean(target) == path.Join(r.d.Root.Base(), hostroot.ReleasesDir, n) {
			if dir, err := release.Dir(r.d.Root, n); err == nil {
				if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
					return n
				}
			}
		}
	}
	return ""
}

// lastGood decides a missing or broken last-good link: it is pointed at
// current when current checked clean and no agent upgrade is pending or on
// probation (then the upgrader and the new watcher own last-good). Without
// it the recovery unit has no release to fall back to; a current that
// verifies against its manifest (and is running this bootstrap) is the best
// one there is.
func (r *repairer) lastGood(rep *verify.Report) {
	c := find(rep, verify.CheckLastGood)
	if c.Status != verify.Problem {
		return
	}
	f := c.Findings[0]
	if cur := find(rep, verify.CheckCurrent); cur.Status != verify.OK {
		r.left(verify.CheckLastGood, f, "current does not verify either: there is no good release to name")
		return
	}
	if busy := upgradeUnderWay(r.d.Root); busy != "" {
		r.left(verify.CheckLastGood, f, "an agent upgrade is under way ("+busy+"): the upgrader and the new watcher set last-good")
		return
	}
	name, err := release.Current(r.d.Root)
	if err == nil {
		err = release.SetLastGood(r.d.Root, name)
	}
	if err != nil {
		r.left(verify.CheckLastGood, f, err.Error())
		return
	}
	r.repaired(verify.CheckLastGood, f, "pointed at the current release "+path.Join(hostroot.ReleasesDir, name))
}

// ensureLastGood points a missing last-good link at current: the
// installation's commit (installing-units) makes the release it installed,
// or the one Ignition laid down, the one to fall back to, as an agent
// upgrade does for the release it leaves. A link already there is the
// repair's (lastGood) or the upgrader's.
func ensureLastGood(root *hostroot.Root, log *slog.Logger) error {
	base, err := root.Path()
	if err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(base, hostroot.LastGoodLink)); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	name, err := release.Current(root)
	if err != nil {
		return err
	}
	if err := release.SetLastGood(root, name); err != nil {
		return err
	}
	log.Info("last-good set to the installed release", "release", path.Join(hostroot.ReleasesDir, name))
	return nil
}

// upgradeUnderWay names the upgrade state file present, "" when none.
func upgradeUnderWay(root *hostroot.Root) string {
	dir := requests.New(root)
	for _, p := range []func() (string, error){dir.UpgradeSignalPath, dir.ProbationPath} {
		if local, err := p(); err == nil {
			if _, err := os.Lstat(local); !errors.Is(err, fs.ErrNotExist) {
				return root.HostPath(hostroot.StateDir, filepath.Base(local))
			}
		}
	}
	return ""
}

// unitFiles writes again each unit file and link a finding names, as the
// current release renders it (what verify compared with), journalled; a
// kubeslot unit file the release does not have goes when the journal says
// kubeslot made it.
func (r *repairer) unitFiles(ctx context.Context, c verify.Result) error {
	if c.Status != verify.Problem {
		return nil
	}
	rendered, err := r.renderCurrent()
	if err != nil {
		for _, f := range c.Findings {
			r.left(verify.CheckUnitFiles, f, "the current release's units cannot be rendered: "+err.Error())
		}
		return nil
	}
	var dropped []string
	for _, f := range c.Findings {
		name := path.Base(f.File)
		data, ok := rendered[name]
		switch {
		case f.Field == "presence" && !ok:
			if dropped == nil {
				if dropped, err = unitinstall.Dropped(r.d.Root, r.rec, rendered); err != nil {
					return err
				}
			}
			if !slices.Contains(dropped, name) {
				r.left(verify.CheckUnitFiles, f, "kubeslot's journal does not say kubeslot made it: the file is someone else's to remove")
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, startTimeout)
			err := r.d.Systemd.StopUnit(sctx, name)
			cancel()
			if err != nil {
				r.left(verify.CheckUnitFiles, f, "stopping it failed: "+err.Error())
				continue
			}
			if _, err := unitinstall.Remove(r.d.Root, name); err != nil {
				return err
			}
			r.reload = true
			r.repaired(verify.CheckUnitFiles, f, "stopped and removed (the journal keeps its entry)")
		case !ok:
			r.left(verify.CheckUnitFiles, f, "not a unit of the current release")
		case f.File == path.Join(hostroot.UnitDir, name):
			changed, err := unitinstall.WriteUnit(r.d.Root, r.rec, f.File, data)
			if err != nil {
				r.left(verify.CheckUnitFiles, f, err.Error())
				continue
			}
			if changed {
				r.reload = true
				r.repaired(verify.CheckUnitFiles, f, "written as the current release renders it (0644)")
			}
		default: // an enablement link
			target := path.Join(hostroot.UnitDir, name)
			changed, err := unitinstall.EnsureLink(r.d.Root, r.rec, f.File, target)
			if err != nil {
				r.left(verify.CheckUnitFiles, f, err.Error())
				continue
			}
			if changed {
				r.reload = true
				r.repaired(verify.CheckUnitFiles, f, "linked to "+target)
			}
		}
	}
	return nil
}

// renderCurrent is the current release's units, as verify renders them.
func (r *repairer) renderCurrent() (map[string][]byte, error) {
	name, err := release.Current(r.d.Root)
	if err != nil {
		return nil, err
	}
	dir, err := release.Dir(r.d.Root, name)
	if err != nil {
		return nil, err
	}
	out, _, err := release.RenderUnits(r.d.Root, dir)
	return out, err
}

// machine repairs the active slot's node: its boot link made again, its
// unit started when it is neither active nor starting. A machine machined
// does not list while its unit runs is left: it registers as it boots.
func (r *repairer) machine(ctx context.Context, c verify.Result, mode isolation.Mode) error {
	name := r.applied.Slot
	unit := mode.MachineUnit(name)
	for _, f := range c.Findings {
		switch {
		case f.File == mode.BootLink(name).Path:
			changed, err := (&slot.BootLinks{Root: r.d.Root, Record: r.rec, Log: r.log, Mode: mode}).Enable(name)
			if err != nil {
				return err
			}
			r.reload = r.reload || changed
			r.repaired(verify.CheckMachine, f, "enabled "+unit+" at boot")
		case f.File == unit && strings.HasPrefix(f.Value, "activating"):
			r.left(verify.CheckMachine, f, "it is starting")
		case f.File == unit:
			sctx, cancel := context.WithTimeout(ctx, startTimeout)
			err := r.d.Systemd.StartUnit(sctx, unit)
			cancel()
			if err != nil {
				r.left(verify.CheckMachine, f, "starting it failed: "+err.Error())
				continue
			}
			r.repaired(verify.CheckMachine, f, "started "+unit)
		default:
			r.left(verify.CheckMachine, f, "machined lists the machine once its unit has booted it; if it stays so, restart the node (a Restart MachineOperation)")
		}
	}
	return nil
}

// unitsState: a unit that is not enabled although its links are (or were
// just made) needs systemd to read them again; one that is not active is
// started by Run once the lock is released (ensureActive logs it).
func (r *repairer) unitsState(c verify.Result) {
	for _, f := range c.Findings {
		switch f.Field {
		case "UnitFileState":
			r.reload = true
			r.repaired(verify.CheckUnitsState, f, "enablement links as unit-files wants them, systemd reloaded")
		case "ActiveState":
			r.log.Info("not active: started once the installation lock is released", "check", verify.CheckUnitsState, "file", f.File, "was", f.Value)
		}
	}
}
