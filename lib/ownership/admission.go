package ownership

import (
	"errors"
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// Decision is what Admit allows a stage to do with this host.
type Decision int

// Decisions.
const (
	// Fresh: nothing owns the host. The caller creates the record with New
	// and Save before its first host change.
	Fresh Decision = iota + 1
	// Resume: this installation is unfinished; continue from its checkpoint.
	Resume
	// Complete: this installation finished; nothing to install.
	Complete
)

func (d Decision) String() string {
	switch d {
	case Fresh:
		return "fresh"
	case Resume:
		return "resume"
	case Complete:
		return "complete"
	}
	return fmt.Sprintf("Decision(%d)", int(d))
}

// ErrDifferentInstallation is returned (wrapped) when the host is owned by
// an installation of another machine or configuration fingerprint.
var ErrDifferentInstallation = errors.New("host owned by a different installation")

// ErrResetInProgress is returned (wrapped) when a reset started and did not
// finish.
var ErrResetInProgress = errors.New("reset in progress")

// Admit decides whether an installation of machine with configuration
// fingerprint may proceed on this host:
//
//   - no record: Fresh, with a nil record;
//   - same machine and fingerprint: Resume from the record's checkpoint, or
//     Complete when it is complete;
//   - checkpoint resetting: ErrResetInProgress, whatever the identity;
//   - another machine or fingerprint: ErrDifferentInstallation.
//
// The two refusals also return the record, for status reporting. A damaged
// record returns its *DamagedError. The caller must hold the installation
// lock (Acquire) and keep it while it acts on the decision.
func Admit(root *hostroot.Root, machine, fingerprint string) (Decision, *Record, error) {
	if err := checkIdentity(machine, fingerprint); err != nil {
		return 0, nil, fmt.Errorf("admit installation: %w", err)
	}
	r, err := Load(root)
	if err != nil {
		return 0, nil, err
	}
	d, err := Decide(root, r, machine, fingerprint)
	return d, r, err
}

// Decide is Admit for the record r already loaded (nil: none), as a stage's
// prologue has it (Begin).
func Decide(root *hostroot.Root, r *Record, machine, fingerprint string) (Decision, error) {
	if err := checkIdentity(machine, fingerprint); err != nil {
		return 0, fmt.Errorf("admit installation: %w", err)
	}
	if r == nil {
		return Fresh, nil
	}
	p, _ := RecordPath(root)
	if r.Checkpoint == CheckpointResetting {
		return 0, fmt.Errorf("installation %s (machine %q, fingerprint %s) is being reset since %s (%s): finish the reset first: run kubeslot-resetter again: %w",
			r.InstallID, r.Machine, ShortFingerprint(r.Fingerprint), r.UpdatedAt.Format(time.RFC3339), p, ErrResetInProgress)
	}
	if r.Machine != machine || r.Fingerprint != fingerprint {
		return 0, fmt.Errorf("host is owned by installation %s of machine %q with config fingerprint %s (%s); this run is for machine %q with fingerprint %s: a different installation needs a reset first: run kubeslot-resetter, then install again: %w",
			r.InstallID, r.Machine, ShortFingerprint(r.Fingerprint), p, machine, ShortFingerprint(fingerprint), ErrDifferentInstallation)
	}
	if r.Checkpoint == CheckpointComplete {
		return Complete, nil
	}
	return Resume, nil
}
