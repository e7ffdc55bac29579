package hostprep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// sysctlChange is one key's entry in a KindSysctlFile journal entry's
// Prior.Value (a JSON object keyed by sysctl key).
type sysctlChange struct {
	Prior string `json:"prior"` // runtime value before kubeslot
	Set   string `json:"set"`   // the value kubeslot wrote
}

// swapInfo is a KindSwapOff journal entry's Prior.Value.
type swapInfo struct {
	Type     string `json:"type"`
	Priority int    `json:"priority"`
}

// Apply brings the host to req. It first surveys the host and refuses,
// changing nothing, when any step is blocked (a missing package that may not
// be installed, a file it must not replace). Then, in the order of the plan,
// it journals each change in rec before making it. It is idempotent: on a
// prepared host it changes nothing and journals nothing. The caller holds
// the installation lock.
func Apply(ctx context.Context, root *hostroot.Root, sys System, rec *ownership.Record, req Requirements, log *slog.Logger) error {
	if rec == nil {
		return errors.New("host preparation: no ownership record to journal changes in")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := surveyHost(ctx, root, sys, req)
	if err != nil {
		return fmt.Errorf("%w (nothing was changed)", err)
	}
	if err := s.plan.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("host preparation: %w (nothing was changed)", err)
	}
	a := &applier{root: root, sys: sys, rec: rec, log: log}
	d := s.plan.Distro
	log.Info("host distribution", "id", d.ID, "id_like", d.IDLike, "variant_id", d.VariantID, "family", d.Family,
		"evidence", d.Evidence, "installs_packages", d.Family.InstallsPackages() && req.InstallPackages)

	if len(s.install) > 0 {
		tool := installTool(d.Family)
		for _, p := range s.install {
			if err := a.record(ownership.Change{Kind: ownership.KindPackage, Name: p, Prior: ownership.Prior{State: ownership.PriorAbsent}}); err != nil {
				return err
			}
		}
		log.Info("host change", "kind", ownership.KindPackage, "target", s.install, "action", tool+" install")
		if err := sys.InstallPackages(ctx, s.install...); err != nil {
			return fmt.Errorf("install packages %v: %w", s.install, err)
		}
		for _, p := range s.install { // the tool's exit status alone is not proof
			if ok, err := sys.PackageInstalled(ctx, p); err != nil || !ok {
				return fmt.Errorf("package %s: not installed after %s install (%v)", p, tool, err)
			}
		}
	}
	for _, d := range s.dirs {
		if err := a.mkdir(d); err != nil {
			return err
		}
	}
	if s.modFile != nil && s.modFile.write {
		if err := a.writeFile(s.modFile, ""); err != nil {
			return err
		}
	}
	for _, m := range s.load {
		log.Info("host change", "kind", KindModuleLoad, "target", m, "action", "modprobe")
		if err := sys.LoadModule(ctx, m); err != nil {
			return fmt.Errorf("load kernel module %s: %w", m, err)
		}
	}
	if s.sysFile != nil {
		if err := a.sysctls(s.sysFile, s.sysctls, s.want.Sysctls); err != nil {
			return err
		}
	}
	for _, sw := range s.swaps {
		info, _ := json.Marshal(swapInfo{Type: sw.Type, Priority: sw.Priority})
		if err := a.record(ownership.Change{Kind: ownership.KindSwapOff, Path: sw.Path,
			Prior: ownership.Prior{State: ownership.PriorPresent, Value: string(info)}}); err != nil {
			return err
		}
		log.Info("host change", "kind", ownership.KindSwapOff, "target", sw.Path, "action", "swapoff", "type", sw.Type, "priority", sw.Priority)
		if err := sys.SwapOff(ctx, sw.Path); err != nil {
			return fmt.Errorf("turn swap %s off: %w", sw.Path, err)
		}
	}
	return nil
}

type applier struct {
	root *hostroot.Root
	sys  System
	rec  *ownership.Record
	log  *slog.Logger
}

// record journals c durably; the change must not be made if it fails.
func (a *applier) record(c ownership.Change) error {
	return a.rec.Record(a.root, c)
}

// mkdir creates a directory the host lacked (its parent exists: the survey
// checked).
func (a *applier) mkdir(hostDir string) error {
	prior, err := ownership.CapturePrior(a.root, hostDir)
	if err != nil {
		return err
	}
	if prior.State == ownership.PriorDir {
		return nil // appeared since the survey; not ours
	}
	if prior.State != ownership.PriorAbsent {
		return fmt.Errorf("%s: expected a directory, found a %s", hostDir, prior.State)
	}
	local, err := localPath(a.root, hostDir)
	if err != nil {
		return err
	}
	if err := a.record(ownership.Change{Kind: ownership.KindDir, Path: hostDir, Prior: prior}); err != nil {
		return err
	}
	a.log.Info("host change", "kind", ownership.KindDir, "target", hostDir, "action", "create directory", "mode", "0755")
	if err := os.Mkdir(local, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create directory %s: %w", local, err)
	}
	if err := os.Chmod(local, 0o755); err != nil {
		return fmt.Errorf("create directory %s: %w", local, err)
	}
	return atomicfile.SyncDir(filepath.Dir(local))
}

// writeFile journals the file's prior state (with value in Prior.Value)
// and then replaces it atomically.
func (a *applier) writeFile(fw *fileWork, value string) error {
	if err := a.journalFile(fw, value); err != nil {
		return err
	}
	return a.replace(fw)
}

func (a *applier) journalFile(fw *fileWork, value string) error {
	prior, err := ownership.CapturePrior(a.root, fw.hostPath)
	if err != nil {
		return err
	}
	// The survey refused links; one that appeared since is refused too,
	// since replacing it would lose it (and Value carries our own data).
	if prior.State != ownership.PriorAbsent && prior.State != ownership.PriorFile {
		return fmt.Errorf("%s: found a %s, kubeslot only replaces regular files", fw.hostPath, prior.State)
	}
	prior.Value = value
	return a.record(ownership.Change{Kind: fw.kind, Path: fw.hostPath, Prior: prior})
}

func (a *applier) replace(fw *fileWork) error {
	local, err := localPath(a.root, fw.hostPath)
	if err != nil {
		return err
	}
	a.log.Info("host change", "kind", fw.kind, "target", fw.hostPath, "action", "write file", "bytes", len(fw.content), "mode", "0644")
	if err := atomicfile.WriteFile(local, fw.content, fileMode); err != nil {
		return err
	}
	return nil
}

// sysctls writes the sysctl file and the runtime values. The runtime values
// kubeslot changes are read now, after the module loads (the bridge keys
// exist only once br_netfilter is in), and journalled with the file in one
// entry before either is touched.
func (a *applier) sysctls(fw *fileWork, keys []string, want map[string]string) error {
	changes := map[string]sysctlChange{}
	for _, k := range keys {
		cur, err := a.sys.ReadSysctl(k)
		if err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
		if normValue(cur) != normValue(want[k]) {
			changes[k] = sysctlChange{Prior: cur, Set: normValue(want[k])}
		}
	}
	if !fw.write && len(changes) == 0 {
		return nil
	}
	value := ""
	if len(changes) > 0 {
		b, err := json.Marshal(changes) // keys sorted: stable journal
		if err != nil {
			return err
		}
		value = string(b)
	}
	if err := a.journalFile(fw, value); err != nil {
		return err
	}
	if fw.write {
		if err := a.replace(fw); err != nil {
			return err
		}
	}
	for _, k := range keys {
		c, ok := changes[k]
		if !ok {
			continue
		}
		a.log.Info("host change", "kind", KindSysctlValue, "target", k, "action", "set", "value", c.Set, "prior", c.Prior)
		if err := a.sys.WriteSysctl(k, c.Set); err != nil {
			return fmt.Errorf("set sysctl %s = %s: %w", k, c.Set, err)
		}
	}
	return nil
}

// localPath resolves the parent of hostPath and joins the last component
// unresolved, as ownership.CapturePrior does, so the file replaced is the
// one whose prior state was captured, never a link's target.
func localPath(root *hostroot.Root, hostPath string) (string, error) {
	dir, err := root.Resolve(path.Dir(hostPath))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, path.Base(hostPath)), nil
}
