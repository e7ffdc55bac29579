// Package repavestate is the repave transition's durable state,
// <base>/state/repave.json: its phases and the file's schema. lib/repave
// writes it before each phase; lib/cachekeep reads the desired
// configuration of a repave under way to keep its artifacts. It is a
// package of its own because lib/repave imports lib/cachekeep, so both
// read the one type from here. Imported by those two only.
//
// The file is a plain atomic JSON file rather than a checksummed pair: it
// is rewritten at every phase, and a crash between a data file and its
// sidecar would leave a mismatch that blocks the resume, while an atomic
// rename leaves either the old or the new state.
package repavestate

import (
	"fmt"
	"slices"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// Phase is one step of the repave transition.
type Phase string

// Phases of a repave, in order, and the rollback.
const (
	Prepare  Phase = "prepare"  // provision + configure the target; the node keeps serving
	Standby  Phase = "standby"  // boot the target's machine warm (no containerd, no kubelet); the node keeps serving
	Drain    Phase = "drain"    // cordon the Node, evict its pods (lib/drain); the node keeps serving
	Switch   Phase = "switch"   // stop the old node gracefully
	Start    Phase = "start"    // start containerd and the kubelet in the target (booting it first if it is not)
	Verify   Phase = "verify"   // kubelet healthy, Node Ready as posted by that kubelet
	Commit   Phase = "commit"   // applied config of the target, applied/active, boot link
	Uncordon Phase = "uncordon" // the Node schedulable again, if kubeslot cordoned it
	Clean    Phase = "clean"    // remove the old slot
	Rollback Phase = "rollback" // stop the target, start the old slot
	// RollbackVerify waits for the old slot's node (started again if a
	// reboot came in between) and removes the failed target.
	RollbackVerify Phase = "rollback-verify"
	// RestartNode is the one phase of a restart in place (a test can pause
	// there, after the claim).
	RestartNode Phase = "restart-node"
	// PatchKubelet puts a patch release's kubelet into the running node
	// (the in-place path; no state file either).
	PatchKubelet Phase = "patch-kubelet"
)

// Phases lists the forward phases in order.
func Phases() []Phase {
	return []Phase{Prepare, Standby, Drain, Switch, Start, Verify, Commit, Uncordon, Clean}
}

// AllPhases are the forward phases, the rollback's, the restart's and the
// in-place patch's.
func AllPhases() []Phase {
	return append(Phases(), Rollback, RollbackVerify, RestartNode, PatchKubelet)
}

// Valid reports whether p is a forward phase or a rollback phase.
func (p Phase) Valid() bool { return slices.Contains(AllPhases(), p) }

// State is the durable repave transition.
type State struct {
	RequestID         string `json:"requestID"`
	Operation         string `json:"operation,omitempty"`
	MachineGeneration int64  `json:"machineGeneration"`
	From              string `json:"from"`
	To                string `json:"to"`
	// Desired is the target's configuration. It holds the join secret,
	// hence the file is 0600.
	Desired *config.Config `json:"desired"`
	// Phase is the phase being run (written before it runs).
	Phase Phase `json:"phase"`
	// Reason is why the repave rolls back (rollback phases only).
	Reason string `json:"reason,omitempty"`
	// FailedIn is the phase that failed (rollback phases only).
	FailedIn  Phase     `json:"failedIn,omitempty"`
	StartedAt time.Time `json:"startedAt"`
	// SwitchAt is when the old node began to stop: the start of the node
	// downtime.
	SwitchAt time.Time `json:"switchAt,omitzero"`
	// ReadyAt is when verify saw the target's Node Ready: the end of the
	// node downtime.
	ReadyAt time.Time `json:"readyAt,omitzero"`
	// Warning is what went wrong without undoing anything (a forced
	// drain, the Node's labels not updated, the Node not uncordoned); it
	// ends up in the final status.
	Warning string                 `json:"warning,omitempty"`
	Phases  []requests.PhaseTiming `json:"phases,omitempty"`
	// Disruption is the request's drain policy (nil: the defaults);
	// SkipDrain a repave by hand with --no-drain.
	Disruption *drain.Policy `json:"disruption,omitempty"`
	SkipDrain  bool          `json:"skipDrain,omitempty"`
	// Drain is the drain's last progress, carried into every status.
	Drain *drain.Progress `json:"drain,omitempty"`
}

// Validate refuses a transition that no repave could resume.
func (st *State) Validate() error {
	if !st.Phase.Valid() || st.From == "" || st.To == "" || st.From == st.To || st.Desired == nil || st.RequestID == "" {
		return fmt.Errorf("phase %q, from %q, to %q, request %q: incomplete or invalid", st.Phase, st.From, st.To, st.RequestID)
	}
	return nil
}

// File is <base>/state/repave.json. It holds the join secret: 0600.
var File = hostroot.StateFile[State]{
	Dir: hostroot.StateDir, Name: "repave.json", Max: 16 << 20, Perm: 0o600,
	Validate: (*State).Validate,
	Advice:   "the repave state is damaged; remove it only after checking which slot runs",
}
