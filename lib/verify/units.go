package verify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
	"github.com/kubeslot/kubeslot/units"
)

// maxTemplate bounds one unit file read from the host.
const maxTemplate = 1 << 20

// renderCurrent renders the unit templates of the release current names
// (its units/; a release without one, laid down by Ignition, has this
// binary's embedded templates, as the bootstrap that installed its units
// used), and says where they came from.
func renderCurrent(root *hostroot.Root) (map[string][]byte, string, error) {
	rel, err := release.Current(root)
	if err != nil {
		return nil, "", err
	}
	dir, err := release.Dir(root, rel)
	if err != nil {
		return nil, "", err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, "", fmt.Errorf("%s names %s, which is not a release directory", root.HostPath(hostroot.CurrentLink), path.Join(hostroot.ReleasesDir, rel))
	}
	out, builtin, err := release.RenderUnits(root, dir)
	if builtin {
		return out, "this binary's templates (" + path.Join(hostroot.ReleasesDir, rel) + " has no units/)", err
	}
	return out, path.Join(hostroot.ReleasesDir, rel, bundle.UnitsDir), err
}

// checkUnitFiles compares every unit file in /etc/systemd/system with what
// the current release renders (content and mode 0644), checks each enabled
// unit's links, and names kubeslot unit files the release does not have.
// It returns the rendered units for the state check (nil when they cannot
// be rendered).
func checkUnitFiles(root *hostroot.Root) (Result, map[string][]byte) {
	rendered, from, err := renderCurrent(root)
	if err != nil {
		return Result{Name: CheckUnitFiles, Status: Skipped, Detail: "the current release's units cannot be rendered: " + err.Error()}, nil
	}
	var findings []Finding
	links := 0
	for _, name := range slices.Sorted(maps.Keys(rendered)) {
		hostPath := path.Join(hostroot.UnitDir, name)
		findings = append(findings, compareUnit(root, hostPath, rendered[name], from)...)
		if strings.Contains(name, "@.") {
			continue
		}
		for _, link := range unitinstall.Links(name, rendered[name]) {
			links++
			local, err := unitinstall.LocalEntry(root, link)
			if err != nil {
				findings = append(findings, Finding{File: link, Field: "path", Value: err.Error()})
				continue
			}
			if got, err := os.Readlink(local); err != nil {
				findings = append(findings, Finding{File: link, Field: "target", Value: "not a link: " + errText(err), Want: hostPath})
			} else if got != hostPath {
				findings = append(findings, Finding{File: link, Field: "target", Value: got, Want: hostPath})
			}
		}
	}
	// A kubeslot unit file the release does not render: left behind, or a
	// reset's unit on a host that is not resetting.
	if dir, err := root.Resolve(hostroot.UnitDir); err == nil {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			n := e.Name()
			if strings.HasPrefix(n, "kubeslot-") && e.Type().IsRegular() && rendered[n] == nil {
				findings = append(findings, Finding{File: path.Join(hostroot.UnitDir, n), Field: "presence", Value: "present", Want: "absent: " + from + " has no such unit"})
			}
		}
	}
	return result(CheckUnitFiles, findings, fmt.Sprintf("%d unit files as %s renders them, %d enablement links", len(rendered), from, links)), rendered
}

// compareUnit checks one unit file against its rendering.
func compareUnit(root *hostroot.Root, hostPath string, want []byte, from string) []Finding {
	local, err := unitinstall.LocalEntry(root, hostPath)
	if err != nil {
		return []Finding{{File: hostPath, Field: "path", Value: err.Error()}}
	}
	fi, err := os.Lstat(local)
	if err != nil {
		return []Finding{{File: hostPath, Field: "presence", Value: errText(err), Want: "as " + from + " renders it"}}
	}
	if !fi.Mode().IsRegular() {
		return []Finding{{File: hostPath, Field: "type", Value: fi.Mode().Type().String(), Want: "a regular file"}}
	}
	var out []Finding
	if fi.Mode().Perm() != 0o644 {
		out = append(out, Finding{File: hostPath, Field: "mode", Value: fi.Mode().Perm().String(), Want: fs.FileMode(0o644).String()})
	}
	got, err := hostroot.ReadRegular(local, maxTemplate)
	if err != nil {
		return append(out, Finding{File: hostPath, Field: "content", Value: err.Error()})
	}
	if !bytes.Equal(got, want) {
		out = append(out, Finding{File: hostPath, Field: "content", Value: firstDiff(got, want),
			Want: fmt.Sprintf("sha256 %x as %s renders it", sha256.Sum256(want), from)})
	}
	return out
}

// firstDiff names the first line where got differs from want.
func firstDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if i >= len(g) || i >= len(w) || gl != wl {
			if len(gl) > 120 {
				gl = gl[:120] + "…"
			}
			return fmt.Sprintf("differs at line %d: %s (sha256 %x)", i+1, strconv.Quote(gl), sha256.Sum256(got))
		}
	}
	return fmt.Sprintf("sha256 %x", sha256.Sum256(got))
}

// checkUnitsState asks systemd whether every unit the release enables is
// enabled and active: the watcher and the path units running, the
// bootstrap (a oneshot that stays active after its run) at least not
// failed. An error reaching systemd is returned, not made a finding.
func checkUnitsState(ctx context.Context, sd Systemd, rendered map[string][]byte) (Result, error) {
	if rendered == nil {
		return Result{Name: CheckUnitsState, Status: Skipped, Detail: "the current release's units cannot be rendered"}, nil
	}
	var findings []Finding
	var names []string
	for _, name := range slices.Sorted(maps.Keys(rendered)) {
		if !unitinstall.Enabled(name, rendered[name]) {
			continue
		}
		names = append(names, name)
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		file, err := sd.UnitFileState(cctx, name)
		var active, sub string
		if err == nil {
			active, sub, err = sd.UnitState(cctx, name)
		}
		cancel()
		if err != nil {
			return Result{Name: CheckUnitsState}, err
		}
		if file != "enabled" {
			findings = append(findings, Finding{File: name, Field: "UnitFileState", Value: orNone(file), Want: "enabled"})
		}
		switch {
		case name == units.Bootstrap:
			if active == "failed" {
				findings = append(findings, Finding{File: name, Field: "ActiveState", Value: active + "/" + sub, Want: "not failed (its run at boot succeeded)"})
			}
		case active != "active":
			findings = append(findings, Finding{File: name, Field: "ActiveState", Value: active + "/" + sub, Want: "active"})
		}
	}
	return result(CheckUnitsState, findings, "enabled and active: "+strings.Join(names, ", ")), nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
