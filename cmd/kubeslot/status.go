package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kubeslot/kubeslot/lib/cli"

	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
)

type statusCmd struct {
	Output string `short:"o" help:"Output format: text or json." enum:"text,json" default:"text"`
}

// status is what `kubeslot status -o json` prints; scripts rely on its
// field names. It never holds a secret: the applied configuration appears
// only as its summary and fingerprint.
type status struct {
	Installed     bool           `json:"installed"`
	HostRoot      string         `json:"hostRoot"`
	LayoutVersion int            `json:"layoutVersion,omitempty"`
	Ownership     *ownershipView `json:"ownership,omitempty"`
	// OwnershipDamaged: a record exists but cannot be trusted (see
	// Problems); the host is not free.
	OwnershipDamaged bool            `json:"ownershipDamaged,omitempty"`
	ActiveSlot       string          `json:"activeSlot,omitempty"`
	Applied          *appliedSummary `json:"applied,omitempty"`
	Requests         []string        `json:"requests"`
	// Claimed are requests a worker took and has not finished, as
	// "<file> (<request ID>)".
	Claimed []string `json:"claimed"`
	// Rejected are request files moved aside because no worker could use
	// them (each also has a Failed status when it named a request ID).
	Rejected []string `json:"rejected"`
	// Slots says how each slot's rootfs is made (the fast path
	// or the copy, and why).
	Slots []slotView `json:"slots,omitempty"`
	// Distro is the host's distribution as host preparation detects it,
	// and what kubeslot installed there.
	Distro   *distroView `json:"distro,omitempty"`
	Problems []string    `json:"problems"`
}

// distroView is hostprep.Distro with the packages kubeslot installed (its
// journal's package entries, undone by reset): none on a host whose family
// installs no packages.
type distroView struct {
	hostprep.Distro
	InstallsPackages  bool     `json:"installsPackages"`
	PackagesInstalled []string `json:"packagesInstalled"`
}

// slotView is one slot's rootfs: "overlay" (layers over the clean tree),
// "copy" (the fallback, with the reason no fast path was taken) or "none".
type slotView struct {
	Slot       string `json:"slot"`
	Rootfs     string `json:"rootfsMechanism"`
	NoFastPath string `json:"noFastPath,omitempty"`
}

type ownershipView struct {
	InstallID    string    `json:"installID"`
	Machine      string    `json:"machine"`
	Checkpoint   string    `json:"checkpoint"`
	Fingerprint  string    `json:"fingerprint"`
	AgentVersion string    `json:"agentVersion"`
	UpdatedAt    time.Time `json:"updatedAt"`
	HostChanges  int       `json:"hostChanges"`
}

type appliedSummary struct {
	Slot         string    `json:"slot"`
	Mode         string    `json:"mode"`
	Summary      string    `json:"summary"`
	Fingerprint  string    `json:"fingerprint"`
	AgentVersion string    `json:"agentVersion"`
	AppliedAt    time.Time `json:"appliedAt"`
}

func (c statusCmd) Run(e *env) error {
	root, err := e.globals.Root()
	if err != nil {
		return err
	}
	st := collect(root)
	if c.Output == "json" {
		enc := json.NewEncoder(e.io.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return err
		}
	} else {
		printStatus(e.io.Stdout, st)
	}
	if len(st.Problems) > 0 {
		return cli.ErrReported
	}
	return nil
}

// collect reads everything status shows. A damaged file is a problem to
// show, not a reason to show nothing.
func collect(root *hostroot.Root) *status {
	st := &status{HostRoot: root.Base(), Requests: []string{}, Claimed: []string{}, Rejected: []string{}, Problems: []string{}}
	problem := func(err error) { st.Problems = append(st.Problems, err.Error()) }

	if v, found, err := root.ReadLayoutVersion(); err != nil {
		problem(err)
	} else if found {
		st.LayoutVersion = v
		if v != hostroot.LayoutVersion {
			p, _ := root.File(hostroot.LayoutFile)
			problem(fmt.Errorf("%s: layout version %d, this release understands %d: what follows may be misread; run the matching release", p, v, hostroot.LayoutVersion))
		}
	}
	rec, err := ownership.Load(root)
	if d, derr := hostprep.DetectDistro(root); derr != nil {
		problem(derr)
	} else {
		st.Distro = &distroView{Distro: d, InstallsPackages: d.Family.InstallsPackages(), PackagesInstalled: []string{}}
		if rec != nil {
			for _, c := range rec.Journal {
				if c.Kind == ownership.KindPackage {
					st.Distro.PackagesInstalled = append(st.Distro.PackagesInstalled, c.Name)
				}
			}
		}
	}
	switch {
	case err != nil:
		st.OwnershipDamaged = errors.Is(err, ownership.ErrDamagedRecord)
		problem(err)
	case rec != nil:
		st.Installed = true
		st.Ownership = &ownershipView{
			InstallID: rec.InstallID, Machine: rec.Machine, Checkpoint: string(rec.Checkpoint),
			Fingerprint: rec.Fingerprint, AgentVersion: rec.AgentVersion, UpdatedAt: rec.UpdatedAt,
			HostChanges: len(rec.Journal),
		}
	}
	store := state.NewStore(root)
	if a, err := store.ActiveApplied(); err != nil {
		problem(err)
	} else if a != nil {
		st.ActiveSlot = a.Slot
		st.Applied = &appliedSummary{
			Slot: a.Slot, Mode: a.Mode, Summary: a.Config.Summary(), Fingerprint: a.Fingerprint,
			AgentVersion: a.AgentVersion, AppliedAt: a.AppliedAt,
		}
		if mode, err := isolation.AppliedMode(a); err != nil {
			problem(err)
		} else {
			for _, slot := range a.Config.Isolation.Slots {
				mech, why, found, err := mode.SlotMechanism(root, slot)
				switch {
				case err != nil:
					problem(fmt.Errorf("slot %s rootfs: %w", slot, err))
				case !found:
					st.Slots = append(st.Slots, slotView{Slot: slot, Rootfs: "none"})
				default:
					st.Slots = append(st.Slots, slotView{Slot: slot, Rootfs: mech, NoFastPath: why})
				}
			}
		}
	}
	if dir, err := root.Path(hostroot.RequestsDir); err != nil {
		problem(err)
	} else if ents, err := os.ReadDir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		problem(err)
	} else {
		for _, ent := range ents {
			n := ent.Name()
			if strings.HasPrefix(n, ".") { // skip atomicfile temporaries
				continue
			}
			// Like a claimed one, a pending request no worker can use says
			// so: the worker will move it aside, not run it.
			kind := requests.Kind(strings.TrimSuffix(n, ".json"))
			if _, err := requests.ReadFile(filepath.Join(dir, n), kind); err != nil && kind.Valid() && strings.HasSuffix(n, ".json") {
				n = fmt.Sprintf("%s (unusable: %v)", n, err)
			}
			st.Requests = append(st.Requests, n)
		}
		sort.Strings(st.Requests)
	}
	if dir, err := root.Path(hostroot.StateDir); err != nil {
		problem(err)
	} else if ents, err := os.ReadDir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		problem(err)
	} else {
		for _, ent := range ents {
			n := ent.Name()
			switch {
			case !strings.HasSuffix(n, ".json"):
			case strings.HasPrefix(n, "claimed-"):
				kind := requests.Kind(strings.TrimSuffix(strings.TrimPrefix(n, "claimed-"), ".json"))
				r, err := requests.ReadFile(filepath.Join(dir, n), kind)
				if err != nil {
					st.Claimed = append(st.Claimed, fmt.Sprintf("%s (unusable: %v)", n, err))
				} else {
					st.Claimed = append(st.Claimed, fmt.Sprintf("%s (%s)", n, r.ID))
				}
			case strings.HasPrefix(n, "rejected-"):
				st.Rejected = append(st.Rejected, n)
			}
		}
	}
	return st
}

func printStatus(w io.Writer, st *status) {
	if !st.Installed && !st.OwnershipDamaged && st.ActiveSlot == "" && len(st.Problems) == 0 {
		fmt.Fprintf(w, "No kubeslot installation on this host (%s has no ownership record).\n", st.HostRoot)
		if st.Distro != nil {
			fmt.Fprintf(w, "Distribution: %s\n", printable(st.Distro.String()))
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// Every value may come from a file anyone with root could have edited:
	// control characters are shown escaped, never sent to the terminal.
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, printable(v)) }
	row("Host root:", st.HostRoot)
	if o := st.Ownership; o != nil {
		row("Machine:", o.Machine)
		row("Install ID:", o.InstallID)
		row("Checkpoint:", o.Checkpoint)
		row("Agent version:", o.AgentVersion)
		row("Host changes:", fmt.Sprintf("%d recorded (undone by reset)", o.HostChanges))
		row("Updated:", o.UpdatedAt.Format(time.RFC3339))
	} else if st.OwnershipDamaged {
		row("Ownership:", "damaged record (see PROBLEM below; kubeslot-resetter --force removes the installation)")
	} else {
		row("Ownership:", "none")
	}
	if d := st.Distro; d != nil {
		row("Distribution:", d.String())
		switch {
		// Labels stay within the widest other one ("Pending requests:"):
		// scripts and the hostile corpus rely on the column.
		case len(d.PackagesInstalled) > 0:
			row("Host packages:", strings.Join(d.PackagesInstalled, ", ")+" (installed by kubeslot; removed by reset)")
		case !d.InstallsPackages:
			row("Host packages:", "none: kubeslot installs nothing on this host")
		default:
			row("Host packages:", "none installed by kubeslot (everything needed was there)")
		}
	}
	if a := st.Applied; a != nil {
		row("Active slot:", fmt.Sprintf("%s (%s mode, applied %s)", a.Slot, a.Mode, a.AppliedAt.Format(time.RFC3339)))
		row("Applied:", a.Summary)
		row("Fingerprint:", a.Fingerprint)
	} else {
		row("Active slot:", "none committed yet")
	}
	for _, v := range st.Slots {
		r := v.Rootfs
		if v.NoFastPath != "" {
			r += " (no fast path: " + v.NoFastPath + ")"
		}
		row("Slot "+v.Slot+" rootfs:", r)
	}
	if len(st.Requests) == 0 {
		row("Pending requests:", "none")
	} else {
		row("Pending requests:", strings.Join(st.Requests, ", "))
	}
	if len(st.Claimed) > 0 {
		row("Claimed requests:", strings.Join(st.Claimed, ", "))
	}
	if len(st.Rejected) > 0 {
		row("Refused requests:", strings.Join(st.Rejected, ", ")+" (moved aside into state/; see their Failed status)")
	}
	tw.Flush()
	for _, p := range st.Problems {
		fmt.Fprintf(w, "PROBLEM: %s\n", printable(p))
	}
}

// printable escapes control characters (terminal escape sequences
// included) and invalid UTF-8 the way Go quotes them, keeping the rest.
func printable(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsControl(r) || r == 0x7f:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
