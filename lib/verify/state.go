package verify

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/state"
)

// checkInstallation is the gate: a layout this release understands and an
// ownership record at its last checkpoint. A host with neither record nor
// completed bootstrap cannot be verified (why says so); a damaged record is
// a problem.
func checkInstallation(root *hostroot.Root) (Result, string) {
	layout := root.HostPath(hostroot.LayoutFile)
	v, found, err := root.ReadLayoutVersion()
	switch {
	case err != nil:
		return result(CheckInstallation, []Finding{{File: layout, Field: "content", Value: err.Error()}}, ""), ""
	case found && v != hostroot.LayoutVersion:
		why := fmt.Sprintf("%s: layout version %d, this release understands %d: run the matching release's kubeslot verify", layout, v, hostroot.LayoutVersion)
		return Result{Name: CheckInstallation, Status: Skipped, Detail: why}, why
	}
	recPath := root.HostPath(hostroot.OwnershipFile)
	rec, err := ownership.Load(root)
	switch {
	case errors.Is(err, ownership.ErrDamagedRecord):
		return result(CheckInstallation, []Finding{{File: recPath, Field: "content", Value: err.Error()}}, ""), ""
	case err != nil:
		why := "read the ownership record: " + err.Error()
		return Result{Name: CheckInstallation, Status: Skipped, Detail: why}, why
	case rec == nil:
		why := fmt.Sprintf("not installed: %s has no ownership record", root.Base())
		return Result{Name: CheckInstallation, Status: Skipped, Detail: why}, why
	case rec.Checkpoint == ownership.CheckpointResetting:
		why := recPath + ": a reset is under way"
		return Result{Name: CheckInstallation, Status: Skipped, Detail: why}, why
	case rec.Checkpoint != ownership.CheckpointComplete:
		why := fmt.Sprintf("%s: checkpoint %s: the bootstrap has not finished", recPath, rec.Checkpoint)
		return Result{Name: CheckInstallation, Status: Skipped, Detail: why}, why
	}
	return result(CheckInstallation, nil, fmt.Sprintf("machine %s, install %s, checkpoint complete, layout %d, agent %s",
		rec.Machine, rec.InstallID, hostroot.LayoutVersion, rec.AgentVersion)), ""
}

// checkApplied verifies applied/active and every slot's applied
// configuration against their sha256 sidecars, and that active names a
// slot with one. It returns the active slot's configuration (nil when it
// cannot be read).
func checkApplied(root *hostroot.Root) (Result, *state.Applied) {
	store := state.NewStore(root)
	activePath := root.HostPath(hostroot.AppliedDir, "active")
	var findings []Finding
	corrupt := func(hostPath string, err error) {
		var ce *hostroot.CorruptError
		if errors.As(err, &ce) {
			findings = append(findings, Finding{File: hostPath, Field: "sha256", Value: ce.Reason})
			return
		}
		findings = append(findings, Finding{File: hostPath, Field: "content", Value: err.Error()})
	}
	slot, found, err := store.Active()
	switch {
	case err != nil:
		corrupt(activePath, err)
	case !found:
		findings = append(findings, Finding{File: activePath, Field: "presence", Value: "missing", Want: "the committed slot"})
	}
	var active *state.Applied
	checked := []string{}
	dir, err := root.Path(hostroot.AppliedDir)
	if err != nil {
		findings = append(findings, Finding{File: root.HostPath(hostroot.AppliedDir), Field: "path", Value: err.Error()})
		return result(CheckApplied, findings, ""), nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		findings = append(findings, Finding{File: root.HostPath(hostroot.AppliedDir), Field: "content", Value: err.Error()})
	}
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".json") || strings.HasPrefix(n, ".") {
			continue
		}
		s := strings.TrimSuffix(n, ".json")
		a, err := store.LoadApplied(s)
		if err != nil {
			corrupt(root.HostPath(hostroot.AppliedDir, n), err)
			continue
		}
		checked = append(checked, n)
		if s == slot {
			active = a
		}
	}
	if found && active == nil && !hasFile(findings, root.HostPath(hostroot.AppliedDir, slot+".json")) {
		findings = append(findings, Finding{File: root.HostPath(hostroot.AppliedDir, slot+".json"), Field: "presence",
			Value: "missing", Want: "the configuration of the slot " + activePath + " names"})
	}
	sort.Strings(checked)
	detail := fmt.Sprintf("active slot %s; %s and %s match their sha256 sidecars", slot, "active", strings.Join(checked, ", "))
	return result(CheckApplied, findings, detail), active
}

func hasFile(fs []Finding, file string) bool {
	for _, f := range fs {
		if f.File == file {
			return true
		}
	}
	return false
}

// checkRelease checks that the link (current or last-good) names a release
// directory that matches its manifest, file by file. A release Ignition
// laid down has no manifest: then every binary must be there, and the
// detail says the sums could not be checked.
func checkRelease(root *hostroot.Root, name, link, arch string) Result {
	linkPath := root.HostPath(link)
	if link == hostroot.LastGoodLink {
		// The bootstrap sets last-good at installation (a release Ignition
		// laid down included) and its boot-time run repairs it: without
		// it the recovery unit has no release to fall back to.
		if base, err := root.Path(); err == nil {
			if _, err := os.Lstat(filepath.Join(base, link)); errors.Is(err, fs.ErrNotExist) {
				return result(name, []Finding{{File: linkPath, Field: "presence", Value: "missing",
					Want: "a link to the release to fall back to (the bootstrap sets it at installation and at boot)"}}, "")
			}
		}
	}
	rel, err := readReleaseLink(root, link)
	if err != nil {
		return result(name, []Finding{{File: linkPath, Field: "target", Value: err.Error(), Want: hostroot.ReleasesDir + "/<" + strings.Join(release.Names, "|") + ">"}}, "")
	}
	dir, err := release.Dir(root, rel)
	if err != nil {
		return result(name, []Finding{{File: linkPath, Field: "target", Value: err.Error()}}, "")
	}
	hostDir := root.HostPath(hostroot.ReleasesDir, rel)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		v := "not a directory"
		if err != nil {
			v = "points nowhere: " + errText(err)
		}
		return result(name, []Finding{{File: linkPath, Field: "target", Value: path.Join(hostroot.ReleasesDir, rel) + " " + v, Want: "a release directory"}}, "")
	}
	m, err := bundle.ReadManifest(dir)
	if errors.Is(err, fs.ErrNotExist) {
		var findings []Finding
		for _, b := range release.Binaries {
			fi, err := os.Lstat(filepath.Join(dir, b))
			switch {
			case err != nil:
				findings = append(findings, Finding{File: path.Join(hostDir, b), Field: "presence", Value: errText(err)})
			case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
				findings = append(findings, Finding{File: path.Join(hostDir, b), Field: "mode", Value: fi.Mode().String(), Want: "an executable regular file"})
			}
		}
		return result(name, findings, fmt.Sprintf("%s -> %s: no %s (laid down by Ignition): its %d binaries are there, their sha256 cannot be checked",
			linkPath, rel, bundle.ManifestName, len(release.Binaries)))
	}
	if err != nil {
		return result(name, []Finding{{File: path.Join(hostDir, bundle.ManifestName), Field: "content", Value: err.Error()}}, "")
	}
	var findings []Finding
	for _, f := range m.Files {
		findings = append(findings, checkFile(dir, hostDir, f)...)
	}
	if len(findings) == 0 {
		// What the loop does not cover: unlisted files, the architecture.
		if _, err := bundle.VerifyDir(dir, arch); err != nil {
			findings = append(findings, Finding{File: hostDir, Field: "manifest", Value: err.Error()})
		}
	}
	return result(name, findings, fmt.Sprintf("%s -> %s: version %s, %d files match %s (sha256, size, mode)",
		linkPath, rel, m.Version, len(m.Files), bundle.ManifestName))
}

// readReleaseLink is release.Current or LastGood by link name.
func readReleaseLink(root *hostroot.Root, link string) (string, error) {
	if link == hostroot.LastGoodLink {
		return release.LastGood(root)
	}
	return release.Current(root)
}

// checkFile compares one manifest entry with the file in the release.
func checkFile(dir, hostDir string, want bundle.File) []Finding {
	host := path.Join(hostDir, want.Path)
	f, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(want.Path)), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return []Finding{{File: host, Field: "presence", Value: errText(err), Want: "as " + bundle.ManifestName + " lists it"}}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return []Finding{{File: host, Field: "presence", Value: err.Error()}}
	}
	if !fi.Mode().IsRegular() {
		return []Finding{{File: host, Field: "type", Value: fi.Mode().Type().String(), Want: "a regular file"}}
	}
	var out []Finding
	mode := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if mode != fs.FileMode(want.Mode) {
		out = append(out, Finding{File: host, Field: "mode", Value: mode.String(), Want: fs.FileMode(want.Mode).String()})
	}
	if fi.Size() != want.Size {
		out = append(out, Finding{File: host, Field: "size", Value: fmt.Sprint(fi.Size()), Want: fmt.Sprint(want.Size)})
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, want.Size+1)); err != nil {
		return append(out, Finding{File: host, Field: "content", Value: err.Error()})
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != want.SHA256 {
		out = append(out, Finding{File: host, Field: "sha256", Value: sum, Want: want.SHA256})
	}
	return out
}

// errText is err without the local path (findings name host paths).
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
