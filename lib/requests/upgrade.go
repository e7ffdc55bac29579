package requests

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// UpgradeSignal is the pending-upgrade signal, <base>/state/upgrade-pending.json.
// The upgrader writes it before it switches releases; a rollback (by the
// upgrader or by the recovery unit) records Failure in it; the watcher that
// runs afterwards turns it into the request's final status and removes it:
// Failed with Failure when set, Succeeded when the watcher runs ToVersion and
// the upgrader verified it (the release then goes on probation, Probation).
// Because the outcome is decided by the
// watcher that actually runs, an upgrade is reported Succeeded only by the
// new release and Failed only by the old one.
type UpgradeSignal struct {
	RequestID         string `json:"requestID"`
	Operation         string `json:"operation,omitempty"`
	MachineGeneration int64  `json:"machineGeneration"`
	// FromRelease and ToRelease are release directory names (blue, green);
	// the versions are the manifests' versions.
	FromRelease string    `json:"fromRelease"`
	FromVersion string    `json:"fromVersion"`
	ToRelease   string    `json:"toRelease"`
	ToVersion   string    `json:"toVersion"`
	SwitchedAt  time.Time `json:"switchedAt,omitzero"`
	// Verified is set by the upgrader once the new watcher passed its
	// health gate.
	Verified bool `json:"verified,omitempty"`
	// Failure is why the upgrade was rolled back; the old release runs.
	Failure string `json:"failure,omitempty"`
	// Phases carries the upgrader's progress, for the final status.
	Phases    []PhaseTiming `json:"phases,omitempty"`
	UpdatedAt time.Time     `json:"updatedAt"`
}

// UpgradeSignalPath is the local path of the pending-upgrade signal.
func (d *Dir) UpgradeSignalPath() (string, error) {
	dir, err := d.dir(hostroot.StateDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "upgrade-pending.json"), nil
}

// WriteUpgradeSignal writes s atomically (UpdatedAt stamped, Failure bounded).
func (d *Dir) WriteUpgradeSignal(s *UpgradeSignal) error {
	if !idRE.MatchString(s.RequestID) {
		return fmt.Errorf("upgrade signal: request id %q: want <kind>-<generation>-<operation>", s.RequestID)
	}
	if len(s.Failure) > MaxMessage {
		s.Failure = s.Failure[:MaxMessage]
	}
	s.UpdatedAt = time.Now().UTC()
	p, err := d.UpgradeSignalPath()
	if err != nil {
		return err
	}
	return writeJSON(p, s)
}

// ReadUpgradeSignal returns the pending-upgrade signal, or nil when there is
// none.
func (d *Dir) ReadUpgradeSignal() (*UpgradeSignal, error) {
	p, err := d.UpgradeSignalPath()
	if err != nil {
		return nil, err
	}
	s, err := readJSON[UpgradeSignal](p)
	if s == nil || err != nil {
		return nil, err
	}
	if !idRE.MatchString(s.RequestID) {
		return nil, fmt.Errorf("%s: request id %q: want <kind>-<generation>-<operation>", p, s.RequestID)
	}
	return s, nil
}

// RemoveUpgradeSignal removes the signal (no error when it is absent).
func (d *Dir) RemoveUpgradeSignal() error {
	p, err := d.UpgradeSignalPath()
	if err != nil {
		return err
	}
	return atomicfile.Remove(p)
}

// Probation is <base>/state/upgrade-probation.json: a release whose upgrade
// was reported Succeeded but that has not yet run for its probation window.
// The new watcher writes it with the verdict (before it removes the signal)
// and, once it has been up for the window on that release, advances
// <base>/last-good to it and removes the file. Until then the recovery unit
// still rolls the release back; it records that here (RolledBackAt, Reason),
// and the watcher of the release recovered to reports it on the Machine and
// the operation and then removes the file. The file thus carries a rollback
// after Succeeded across every crash until it is published.
type Probation struct {
	RequestID         string `json:"requestID"`
	Operation         string `json:"operation,omitempty"`
	MachineGeneration int64  `json:"machineGeneration"`
	FromRelease       string `json:"fromRelease"`
	FromVersion       string `json:"fromVersion"`
	ToRelease         string `json:"toRelease"`
	ToVersion         string `json:"toVersion"`
	// SucceededAt is when the verdict was written.
	SucceededAt time.Time `json:"succeededAt"`
	// RolledBackAt and Reason are set by the recovery unit when it rolls
	// the release back while on probation.
	RolledBackAt time.Time `json:"rolledBackAt,omitzero"`
	Reason       string    `json:"reason,omitempty"`
	UpdatedAt    time.Time `json:"updatedAt"`
}

// ProbationPath is the local path of the probation file.
func (d *Dir) ProbationPath() (string, error) {
	dir, err := d.dir(hostroot.StateDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "upgrade-probation.json"), nil
}

// WriteProbation writes p atomically (UpdatedAt stamped, Reason bounded).
func (d *Dir) WriteProbation(p *Probation) error {
	if !idRE.MatchString(p.RequestID) {
		return fmt.Errorf("upgrade probation: request id %q: want <kind>-<generation>-<operation>", p.RequestID)
	}
	if p.ToRelease == "" || p.ToVersion == "" {
		return fmt.Errorf("upgrade probation %s: no release or version upgraded to", p.RequestID)
	}
	if len(p.Reason) > MaxMessage {
		p.Reason = p.Reason[:MaxMessage]
	}
	p.UpdatedAt = time.Now().UTC()
	path, err := d.ProbationPath()
	if err != nil {
		return err
	}
	return writeJSON(path, p)
}

// ReadProbation returns the probation file, or nil when there is none.
func (d *Dir) ReadProbation() (*Probation, error) {
	path, err := d.ProbationPath()
	if err != nil {
		return nil, err
	}
	p, err := readJSON[Probation](path)
	if p == nil || err != nil {
		return nil, err
	}
	if !idRE.MatchString(p.RequestID) {
		return nil, fmt.Errorf("%s: request id %q: want <kind>-<generation>-<operation>", path, p.RequestID)
	}
	if p.ToRelease == "" || p.ToVersion == "" {
		return nil, fmt.Errorf("%s: toRelease %q, toVersion %q: want both", path, p.ToRelease, p.ToVersion)
	}
	return p, nil
}

// RemoveProbation removes the probation file (no error when it is absent).
func (d *Dir) RemoveProbation() error {
	path, err := d.ProbationPath()
	if err != nil {
		return err
	}
	return atomicfile.Remove(path)
}
