package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
)

// Plan is what an upgrade would do, found without changing anything.
type Plan struct {
	RequestID   string `json:"requestID,omitempty"`
	Source      string `json:"source,omitempty"`
	FromRelease string `json:"fromRelease"`
	FromVersion string `json:"fromVersion"`
	ToRelease   string `json:"toRelease"`
	// ToVersion is empty when the bundle is not at hand (a request whose
	// bundle is not downloaded yet).
	ToVersion string `json:"toVersion,omitempty"`
	// UnitChanges are the host paths of unit files and links that would be
	// written.
	UnitChanges []string `json:"unitChanges"`
	// Pending is an interrupted upgrade a run would finish first.
	Pending string   `json:"pending,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

// PreflightPlan reports what Run would do for j, changing nothing on the host
// (no lock, no claim, no download): a local bundle is unpacked into a
// temporary directory outside the host root to read its version and units.
func PreflightPlan(ctx context.Context, d *Deps, j Job) (*Plan, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	p := &Plan{}
	var err error
	if p.FromRelease, err = release.Current(d.Root); err != nil {
		return nil, err
	}
	if p.ToRelease, err = release.Inactive(d.Root); err != nil {
		return nil, err
	}
	fromDir, err := release.Dir(d.Root, p.FromRelease)
	if err != nil {
		return nil, err
	}
	// Nothing is executed here, not even the running release: its version
	// comes from its manifest, or from its watcher's build information.
	if p.FromVersion, err = releaseVersionNoExec(d, fromDir, p); err != nil {
		return nil, err
	}
	if sig, err := d.Requests.ReadUpgradeSignal(); err != nil {
		return nil, err
	} else if sig != nil {
		p.Pending = sig.RequestID
		p.Notes = append(p.Notes, fmt.Sprintf("upgrade %s (%s -> %s) is recorded in the pending-upgrade signal and would be finished or reported first", sig.RequestID, sig.FromVersion, sig.ToVersion))
	}
	local, sha := "", strings.ToLower(j.SHA256)
	switch {
	case j.Bundle != "":
		p.Source, local = artifact.Redact(j.Bundle), j.Bundle
	default:
		var req *requests.Request
		for _, get := range []func(requests.Kind) (*requests.Request, error){d.Requests.Claimed, d.Requests.Pending} {
			if req, err = get(requests.Upgrade); err != nil {
				return nil, err
			}
			if req != nil {
				break
			}
		}
		if req == nil {
			p.Notes = append(p.Notes, "no upgrade request is pending and no --bundle was given: nothing to do")
			return p, nil
		}
		p.RequestID, p.Source, sha = req.ID, artifact.Redact(req.Upgrade.URL), req.Upgrade.SHA256
		if local = d.Fetcher.Cached(sha); local == "" {
			p.Notes = append(p.Notes, "the bundle is not downloaded yet: its version and unit files are known only after the download")
			return p, nil
		}
	}
	tmp, err := os.MkdirTemp("", "kubeslot-preflight-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "release")
	m, err := d.Bundles.Unpack(ctx, local, sha, d.Arch, dir)
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	// The version is the manifest's: the bundle's binaries are not run
	// (without --sha256 nothing vouches for them). The upgrade itself runs
	// each one's --version before it switches.
	p.ToVersion = m.Version
	p.Notes = append(p.Notes, "no binary of the bundle was run; the upgrade runs each one's --version before it switches")
	rendered, err := releaseUnits(d, dir)
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	if p.UnitChanges, err = unitinstall.Changes(d.Root, rendered); err != nil {
		return nil, err
	}
	return p, nil
}

// releaseVersionNoExec is the version of the release in dir without running
// anything: its manifest's, else (a release Ignition laid down has none) the
// agent version the ownership record names, with a note.
func releaseVersionNoExec(d *Deps, dir string, p *Plan) (string, error) {
	m, err := d.Bundles.ReadManifest(dir)
	if err == nil {
		return m.Version, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if rec, err := ownership.Load(d.Root); err == nil && rec != nil && rec.AgentVersion != "" {
		p.Notes = append(p.Notes, fmt.Sprintf("release %s has no manifest: its version is the ownership record's", dir))
		return rec.AgentVersion, nil
	}
	p.Notes = append(p.Notes, fmt.Sprintf("release %s has no manifest, and preflight runs nothing to ask it", dir))
	return "unknown", nil
}

// WriteText prints the plan for a person.
func (p *Plan) WriteText(w io.Writer) {
	to := p.ToVersion
	if to == "" {
		to = "(unknown until downloaded)"
	}
	fmt.Fprintf(w, "upgrade %s (release %s) -> %s (release %s)\n", p.FromVersion, p.FromRelease, to, p.ToRelease)
	if p.RequestID != "" {
		fmt.Fprintf(w, "request: %s\n", p.RequestID)
	}
	if p.Source != "" {
		fmt.Fprintf(w, "bundle: %s\n", p.Source)
	}
	if len(p.UnitChanges) == 0 {
		fmt.Fprintln(w, "unit files: no change")
	} else {
		fmt.Fprintln(w, "unit files that would change:")
		for _, u := range p.UnitChanges {
			fmt.Fprintf(w, "  %s\n", u)
		}
	}
	for _, n := range p.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintln(w, "nothing was changed (preflight)")
}

// WriteJSON prints the plan as JSON.
func (p *Plan) WriteJSON(w io.Writer) error {
	if p.UnitChanges == nil {
		p.UnitChanges = []string{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(p)
}
