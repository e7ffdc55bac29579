package reset

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/units"
)

// DryRun writes what a reset would do, step by step, to w, changing
// nothing: no lock, no systemd, no writes. It reports false when no
// installation owns the host (nothing to reset).
func DryRun(root *hostroot.Root, w io.Writer) (bool, error) { return Plan(root, w, false) }

// Plan is DryRun, and with force the plan of a forced reset of a damaged
// ownership record (Deps.Force): what is salvaged is undone as usual, and
// what was lost is listed, with what to check by hand.
func Plan(root *hostroot.Root, w io.Writer, force bool) (bool, error) {
	rec, err := ownership.Load(root)
	var lost []string
	if errors.Is(err, ownership.ErrDamagedRecord) && force {
		writeLine(w, "the ownership record is damaged: %v", err)
		if rec, lost, err = ownership.Salvage(root); err != nil {
			return false, fmt.Errorf("--force: %w", err)
		}
		writeLine(w, "a forced reset replaces it by what can be salvaged: installation %s of machine %q, %d journal entries", rec.InstallID, rec.Machine, len(rec.Journal))
		for _, l := range lost {
			writeLine(w, "  lost, not undone: %s", l)
		}
		if len(lost) > 0 {
			writeLine(w, "  check by hand what the lost entries changed: node machines (machinectl list), %s/<slot>, %s/<slot>.nspawn, packages kubeslot installed, %s/90-kubeslot.conf, %s/kubeslot.conf, swap",
				hostroot.MachinesDir, hostroot.NspawnDir, hostroot.SysctlDir, hostroot.ModulesDir)
		}
	}
	if err != nil {
		if errors.Is(err, ownership.ErrDamagedRecord) {
			return false, fmt.Errorf("cannot plan a reset from the ownership record: %w; add --force to see what a forced reset would do", err)
		}
		return false, fmt.Errorf("cannot plan a reset from the ownership record: %w", err)
	}
	if rec == nil {
		writeLine(w, "nothing to reset: no installation owns this host (%s)", root.HostPath(hostroot.OwnershipFile))
		return false, nil
	}
	writeLine(w, "installation %s of machine %q (checkpoint %s); a reset would:", rec.InstallID, rec.Machine, rec.Checkpoint)
	r := &runner{d: Deps{Root: root}, rec: rec}
	for i, s := range Steps() {
		writeLine(w, "%2d. %s: %s", i+1, s.Name, s.What)
		for _, line := range r.planStep(s.Name) {
			writeLine(w, "      %s", line)
		}
	}
	writeLine(w, "kept: %s (the operator's configuration, without its join token) and every file, unit and machine kubeslot did not make", units.ConfigPath)
	writeLine(w, "dry run: nothing was changed")
	return true, nil
}

func (r *runner) planStep(step string) []string {
	var out []string
	for _, c := range Group(r.rec, step) {
		out = append(out, describe(c))
	}
	switch step {
	case StepStopWatcher:
		out = append(out, "stop "+units.Watcher)
	case StepStopUnits:
		for _, n := range units.Names() {
			if strings.HasSuffix(n, ".path") || n == units.Recovery {
				out = append(out, "stop "+n)
			}
		}
		for _, w := range workerServices {
			out = append(out, "stop "+w+" (a waiting worker; never the run's own unit)")
		}
		for _, p := range workerPatterns() {
			out = append(out, "stop every loaded "+p)
		}
		for _, n := range units.Names() {
			if strings.HasSuffix(n, ".path") {
				out = append(out, r.presentLinks(n)...)
			}
		}
	case StepStopMachines:
		for _, s := range r.machineSlots() {
			out = append(out, "stop "+machineUnit(s))
			if u := isolation.DefaultMode.RootfsMountUnit(s); u != "" {
				out = append(out, "stop "+u+" (unmounts a layered slot's rootfs)")
			}
		}
	case StepRemoveJoinToken:
		out = append(out, r.planJoinToken())
	case StepRemoveBootstrapUnit:
		out = append(out, "stop "+units.Bootstrap)
		out = append(out, r.presentUnit(units.Bootstrap)...)
	case StepRemoveUnits:
		for _, n := range units.Names() {
			if n != units.Bootstrap {
				out = append(out, r.presentUnit(n)...)
			}
		}
	case StepRemoveHostRoot:
		if base, err := r.base(); err == nil {
			ents, _ := os.ReadDir(base)
			for _, e := range ents {
				if e.Name() != hostroot.OwnershipFile && e.Name() != hostroot.ResettingDir && e.Name() != hostroot.ParentsFile {
					out = append(out, "remove "+path.Join(r.d.Root.Base(), e.Name()))
				}
			}
		} else {
			out = append(out, "BLOCKED: "+err.Error())
		}
	case StepInstallResetting:
		out = append(out, "write "+path.Join(hostroot.UnitDir, units.Resetting)+" and "+r.d.Root.HostPath(hostroot.ResettingDir, resettingBinary)+", enable the unit")
	case StepRemoveRecord:
		out = append(out, "remove "+r.d.Root.HostPath(hostroot.OwnershipFile), "remove "+r.d.Root.HostPath(hostroot.ResettingDir),
			"remove "+r.d.Root.Base()+" (when empty)")
		if parents, err := r.d.Root.LoadParents(); err == nil {
			for i := len(parents) - 1; i >= 0; i-- {
				if !slices.Contains(systemDirs, parents[i]) {
					out = append(out, "remove "+parents[i]+" (made above the base; when empty)")
				}
			}
		}
		out = append(out, "remove "+path.Join(hostroot.UnitDir, units.Resetting)+" and its link "+resettingLink())
	}
	return out
}

// presentLinks lists the not-journalled links of unit name that exist.
func (r *runner) presentLinks(name string) []string {
	var out []string
	links, _ := r.unitLinks(name)
	for _, l := range links {
		if _, found := r.rec.Lookup(ownership.KindUnit, l); found {
			continue
		}
		if local, err := localEntry(r.d.Root, l); err == nil {
			if _, err := os.Lstat(local); err == nil {
				out = append(out, "remove link "+l)
			}
		}
	}
	return out
}

// presentUnit lists the not-journalled file and links of unit name that exist.
func (r *runner) presentUnit(name string) []string {
	var out []string
	if !strings.Contains(name, "@.") && !strings.HasSuffix(name, ".path") {
		out = append(out, r.presentLinks(name)...)
	}
	p := path.Join(hostroot.UnitDir, name)
	if _, found := r.rec.Lookup(ownership.KindUnit, p); !found {
		if local, err := localEntry(r.d.Root, p); err == nil {
			if _, err := os.Lstat(local); err == nil {
				out = append(out, "remove "+p)
			}
		}
	}
	return out
}

// describe says what undoing c does.
func describe(c ownership.Change) string {
	target := c.Path
	if c.Kind.UsesName() {
		target = c.Name
	}
	action := "remove"
	switch c.Prior.State {
	case ownership.PriorFile:
		action = "restore the prior file"
	case ownership.PriorSymlink:
		action = "restore the prior link to " + c.Prior.Value
	case ownership.PriorDir:
		action = "keep (was there before kubeslot)"
	case ownership.PriorPresent:
		action = "turn back on"
		if c.Kind == ownership.KindPackage {
			action = "keep (installed before kubeslot)"
		}
	}
	switch {
	case c.Kind == ownership.KindPackage && c.Prior.State == ownership.PriorAbsent:
		action = "apt-get remove"
	case c.Kind == ownership.KindDir && c.Prior.State == ownership.PriorAbsent:
		action = "remove if empty"
	case c.Kind == ownership.KindPodNetwork:
		action = "delete the link and the CNI firewall chains"
	}
	return fmt.Sprintf("%s %s: %s", c.Kind, target, action)
}
