// Package rolloutview shows a MachineOperation to a person: a per-machine
// status table with a progress bar and the outcome (`kubeslot rollout
// status`, also followed live), and a self-contained HTML report with a
// timeline per machine (`kubeslot rollout report`). What it shows, and the
// outcome a script acts on, come from the entries of the operation's real
// targets (v1alpha1.Verified over the Machines it lists), never from the
// summary or the entries another node could write. Imported by
// cmd/kubeslot and the rig's tests.
package rolloutview

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// View is an operation as its targets' own entries make it, at Now.
type View struct {
	Name string
	Type v1alpha1.OperationType
	// Rollout describes spec.rollout in a few words ("" without one).
	Rollout string
	// Status is the summary recomputed from the counted entries.
	Status v1alpha1.MachineOperationStatus
	// Rows are the targets in rollout order: those with an entry and
	// those that wrote none yet.
	Rows []Row
	// Ignored counts the entries not counted: no Machine of that name and
	// node that the operation targets.
	Ignored int
	Now     time.Time
}

// Row is one target.
type Row struct {
	Machine string
	// Phase is the entry's phase; empty when the target wrote none yet.
	Phase   v1alpha1.OperationPhase
	Message string
	// Start and End are the entry's start and completion (zero: unknown).
	Start, End time.Time
	Steps      []v1alpha1.OperationStep
	orderKey   string
}

// Outcome is how the operation stands, for an exit code.
type Outcome int

const (
	// Running: not finished, not halted.
	Running Outcome = iota
	// Succeeded: every target succeeded.
	Succeeded
	// Failed: finished with failures, or halted on its failure budget.
	Failed
)

// Build makes the View of op, whose targets are looked up among ms (the
// Machines a cluster admin's List returned: the selector's, or all of them
// for a machineRef operation).
func Build(op *v1alpha1.MachineOperation, ms []v1alpha1.Machine, now time.Time) View {
	targets := v1alpha1.TargetNodesOf(op, ms)
	st := v1alpha1.Verified(op, targets.Check)
	counted := v1alpha1.Counted(op, targets.Check)
	v := View{Name: op.Name, Type: op.Spec.Type, Rollout: describeRollout(op.Spec.Rollout), Status: st,
		Ignored: len(op.Status.Machines) - len(counted), Now: now}
	seen := map[string]bool{}
	for _, e := range counted {
		seen[e.Name] = true
		r := Row{Machine: e.Name, Phase: e.Phase, Message: e.Message, Steps: e.Steps, orderKey: e.OrderKey}
		if e.StartTime != nil {
			r.Start = e.StartTime.Time
		}
		if e.CompletionTime != nil {
			r.End = e.CompletionTime.Time
		}
		v.Rows = append(v.Rows, r)
	}
	for i := range ms {
		m := &ms[i]
		if _, ok := targets[m.Name]; !ok || seen[m.Name] {
			continue
		}
		r := Row{Machine: m.Name}
		if op.Spec.Rollout != nil && op.Spec.Rollout.OrderByLabel != "" {
			r.orderKey = m.Labels[op.Spec.Rollout.OrderByLabel]
		}
		v.Rows = append(v.Rows, r)
	}
	slices.SortFunc(v.Rows, func(a, b Row) int {
		return cmp.Or(strings.Compare(a.orderKey, b.orderKey), strings.Compare(a.Machine, b.Machine))
	})
	return v
}

// Outcome is Succeeded, Failed (finished with failures or halted) or
// Running. Succeeded needs an entry from every target: the phase counts
// only the entries there are, and a target whose agent has not picked the
// operation up yet is not done.
func (v View) Outcome() Outcome {
	switch v.Status.Phase {
	case v1alpha1.OperationSucceeded:
		if v.silent() > 0 {
			return Running
		}
		return Succeeded
	case v1alpha1.OperationFailed, v1alpha1.OperationHalted:
		return Failed
	}
	return Running
}

// Summary is the outcome in one line.
func (v View) Summary() string {
	s := v.Status
	phase := string(s.Phase)
	switch {
	case phase == "" || len(v.Rows) == 0:
		phase = string(v1alpha1.OperationPending)
	case s.Phase == v1alpha1.OperationSucceeded && v.Outcome() == Running:
		phase = string(v1alpha1.OperationInProgress) // targets to hear from
	}
	line := fmt.Sprintf("%s: %d of %d machines succeeded, %d failed, %d in progress, %d waiting",
		phase, s.Done, len(v.Rows), s.Failed, s.InProgress, len(v.Rows)-int(s.Done+s.Failed+s.InProgress))
	if s.Phase == v1alpha1.OperationHalted {
		line += "; halted on spec.rollout.failureBudget (raise it to resume, or delete the operation)"
	}
	if quiet := v.silent(); quiet > 0 {
		line += fmt.Sprintf("; %d targets wrote no entry (their agents have not picked the operation up)", quiet)
	}
	if s.Phase.Finished() && s.StartTime != nil && s.CompletionTime != nil {
		line += fmt.Sprintf("; took %s", Duration(s.CompletionTime.Sub(s.StartTime.Time)))
	}
	return line
}

// silent counts the targets with no entry.
func (v View) silent() int {
	n := 0
	for _, r := range v.Rows {
		if r.Phase == "" {
			n++
		}
	}
	return n
}

// Step is what the target is at, and since when (zero: unknown).
func (r Row) Step() (string, time.Time) {
	last, under := "", false
	since := r.Start
	if n := len(r.Steps); n > 0 {
		s := r.Steps[n-1]
		last, under = s.Name, s.DurationMilliseconds == 0
		since = s.StartTime.Add(time.Duration(s.DurationMilliseconds) * time.Millisecond)
	}
	switch r.Phase {
	case "":
		return "no entry yet", time.Time{}
	case v1alpha1.OperationWaiting:
		return "waiting for a slot", time.Time{}
	case v1alpha1.OperationPending:
		return "dispatched", r.Start
	case v1alpha1.OperationInProgress:
		if under {
			return last, since // a worker that records a step as it starts it
		}
		if last != "" {
			return "after " + last, since
		}
		return "started", r.Start
	}
	if last != "" {
		return last, time.Time{}
	}
	return "-", time.Time{}
}

// Duration formats d for a person, stable for tests: tenths of a second
// under a minute, then minutes and seconds, then hours and minutes.
func Duration(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func describeRollout(r *v1alpha1.Rollout) string {
	if r == nil {
		return ""
	}
	mu := "1"
	if r.MaxUnavailable != nil {
		mu = r.MaxUnavailable.String()
	}
	s := fmt.Sprintf("maxUnavailable %s, failureBudget %d", mu, r.Budget())
	if r.Canary > 0 {
		s += fmt.Sprintf(", canary %d", r.Canary)
	}
	if r.OrderByLabel != "" {
		s += ", ordered by " + r.OrderByLabel
	}
	if r.Paused {
		s += ", paused"
	}
	return s
}

// plain makes node-written text safe for a terminal line: control and
// bidirectional-override characters become '?', and it is cut at n runes.
func plain(s string, n int) string {
	var b strings.Builder
	i := 0
	for _, r := range s {
		if i == n {
			b.WriteString("...")
			break
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == unicode.ReplacementChar {
			r = '?'
		}
		b.WriteRune(r)
		i++
	}
	return b.String()
}
