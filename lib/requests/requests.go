// Package requests is the file-drop protocol between the watcher, which
// decides what a host must do, and the worker stages that do it (repaver,
// upgrader, resetter). Imported by the watcher, the worker stages (their
// lib/ packages and cmd/ mains), lib/cachekeep (which keeps what a request
// names) and the CLI; nothing else writes these files.
//
// # Protocol
//
// Requests. The watcher writes <base>/requests/<kind>.json (0600, atomic:
// lib/atomicfile), one file per kind, so there is at most one pending
// request of each kind: two triggers for a repave give one repave. A newer
// request replaces a pending one of the same kind only while it is still in
// requests/ (not claimed). Every request has an ID built from its kind, the
// Machine generation and the operation name ("spec" for a repave the Machine
// spec asked for), so a result can be matched and a request recognised when
// it is seen again.
//
// Claim. A worker claims a request by renaming requests/<kind>.json to
// state/claimed-<kind>.json, and only while it holds the installation lock
// (Claim takes the *ownership.Lock to make that explicit). A worker that
// finds a claimed file resumes it: it was claimed by a run that crashed. The
// worker removes the claimed file (Finish) after it wrote the final status.
//
// Status. Workers write <base>/status/<request ID>.json (0600, atomic) with
// their progress (phases with start times and durations) and the result;
// the watcher reads it (fsnotify on status/) and publishes it to the cluster.
// Only the watcher writes Pending statuses (right after a request file) and
// the published marker, state/published.json: request ID → the last phase it
// published, so that each transition is published once, across restarts.
//
// Memory. The watcher never dispatches an ID twice: a request ID is known
// when it is pending in requests/, claimed in state/, or has a status file
// (Known). The request file is written before its Pending status, so a
// crash between the two still leaves the request as memory.
//
// Path units. kubeslot-<kind>.path starts the worker with PathExists= on the
// request file. A path unit fires again as soon as its service is inactive
// while the file still exists, so a worker that exits 69 without claiming is
// started again at once. With a worker that defers immediately, the
// service hits its start limit (5 starts in 10 s by default) within seconds,
// and the path unit fails with unit-start-limit-hit and stops watching,
// stranding the request. The worker units therefore stay deactivating for
// 5 s after an exit 69 (ExecStopPost=), which holds re-triggers to one per
// ~5 s; workers should also wait (bounded) for the installation lock before
// they defer.
package requests

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// Kind is what a request asks for.
type Kind string

// Kinds of requests, one worker unit each.
const (
	Repave  Kind = "repave"
	Restart Kind = "restart"
	Upgrade Kind = "upgrade"
	Reset   Kind = "reset"
)

// Kinds lists every kind.
func Kinds() []Kind { return []Kind{Repave, Restart, Upgrade, Reset} }

// Valid reports whether k is one of Kinds.
func (k Kind) Valid() bool {
	for _, x := range Kinds() {
		if k == x {
			return true
		}
	}
	return false
}

// Phase is the progress of a request.
type Phase string

// Phases of a request.
const (
	Pending    Phase = "Pending"
	InProgress Phase = "InProgress"
	Succeeded  Phase = "Succeeded"
	Failed     Phase = "Failed"
)

// Finished reports whether p is Succeeded or Failed.
func (p Phase) Finished() bool { return p == Succeeded || p == Failed }

// SpecOperation is the operation part of the ID of a repave the Machine
// spec asked for (no MachineOperation).
const SpecOperation = "spec"

// MaxMessage bounds Status.Message.
const MaxMessage = 1024

// maxFile bounds what is read from a request or status file.
const maxFile = 1 << 20

// UpgradeParams names the bundle of an agent upgrade.
type UpgradeParams struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
}

// Request is one unit of work for a worker.
type Request struct {
	Kind              Kind   `json:"kind"`
	ID                string `json:"id"`
	MachineGeneration int64  `json:"machineGeneration"`
	// Operation is the MachineOperation's name; empty for a repave the
	// Machine spec asked for.
	Operation string `json:"operation,omitempty"`
	Reason    string `json:"reason"`
	// Desired is the node configuration to repave to (repave only): the
	// applied configuration with the Machine spec laid over it. It holds
	// the join secret, hence 0600.
	Desired *config.Config `json:"desired,omitempty"`
	Upgrade *UpgradeParams `json:"upgrade,omitempty"`
	// Disruption is how a repave or restart drains the node first: the
	// Machine's spec.disruption when the request was written (nil: the
	// defaults). Here and not in Desired, so that a change of the drain
	// policy is not a change of the node's configuration.
	Disruption *drain.Policy `json:"disruption,omitempty"`
	CreatedAt  time.Time     `json:"createdAt"`
}

// PhaseTiming is one step of a worker's progress.
type PhaseTiming struct {
	Name      string        `json:"name"`
	StartedAt time.Time     `json:"startedAt"`
	Duration  time.Duration `json:"duration,omitempty"`
}

// Status is a request's progress and result.
type Status struct {
	RequestID         string        `json:"requestID"`
	Kind              Kind          `json:"kind"`
	Operation         string        `json:"operation,omitempty"`
	MachineGeneration int64         `json:"machineGeneration"`
	Phase             Phase         `json:"phase"`
	Message           string        `json:"message,omitempty"`
	Phases            []PhaseTiming `json:"phases,omitempty"`
	// ActiveSlot is the slot the node runs on after the request (repave).
	ActiveSlot string `json:"activeSlot,omitempty"`
	// Downtime is the measured node downtime (repave, restart).
	Downtime time.Duration `json:"downtime,omitempty"`
	// Drain is the progress of the node's drain (repave, restart), the
	// watcher's Draining condition.
	Drain *drain.Progress `json:"drain,omitempty"`
	// Health is the watcher's verdict on a rollout's health gate after a
	// Succeeded (HealthPassed, HealthFailed); "" before or without one.
	Health    string    `json:"health,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Health gate verdicts (Status.Health).
const (
	HealthPassed = "passed"
	HealthFailed = "failed"
)

// idRE keeps IDs usable as file names: operation names are DNS subdomains.
var idRE = regexp.MustCompile(`^[a-z]+-[0-9]+-[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)

// NewID returns the ID of a request of kind for the Machine generation gen
// and the operation op ("" for a spec-driven repave).
func NewID(kind Kind, gen int64, op string) string {
	if op == "" {
		op = SpecOperation
	}
	return fmt.Sprintf("%s-%d-%s", kind, gen, op)
}

func (r *Request) validate() error {
	if !r.Kind.Valid() {
		return fmt.Errorf("request kind %q: not one of repave, restart, upgrade, reset", r.Kind)
	}
	if !idRE.MatchString(r.ID) || !strings.HasPrefix(r.ID, string(r.Kind)+"-") {
		return fmt.Errorf("request id %q: want <kind>-<generation>-<operation>", r.ID)
	}
	if r.Kind == Repave && r.Desired == nil {
		return fmt.Errorf("request %s: a repave needs the desired configuration", r.ID)
	}
	if r.Disruption != nil {
		if err := r.Disruption.Check(); err != nil {
			return fmt.Errorf("request %s: %w", r.ID, err)
		}
	}
	if r.Kind == Upgrade && (r.Upgrade == nil || r.Upgrade.URL == "" || r.Upgrade.SHA256 == "") {
		return fmt.Errorf("request %s: an upgrade needs the bundle URL and sha256", r.ID)
	}
	return nil
}

// Dir is one host root's requests, claims and statuses.
type Dir struct{ root *hostroot.Root }

// New returns the protocol's view of root.
func New(root *hostroot.Root) *Dir { return &Dir{root: root} }

func (d *Dir) dir(name string) (string, error) {
	p, err := d.root.Path(name)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(p, 0o700); err != nil {
		return "", fmt.Errorf("create %s: %w", p, err)
	}
	return p, nil
}

// RequestPath is the local path of the pending request of kind.
func (d *Dir) RequestPath(kind Kind) (string, error) {
	dir, err := d.dir(hostroot.RequestsDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, string(kind)+".json"), nil
}

// ClaimedPath is the local path of the claimed request of kind.
func (d *Dir) ClaimedPath(kind Kind) (string, error) {
	dir, err := d.dir(hostroot.StateDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "claimed-"+string(kind)+".json"), nil
}

// StatusDir is the local path of the status directory (created).
func (d *Dir) StatusDir() (string, error) { return d.dir(hostroot.StatusDir) }

func (d *Dir) statusPath(id string) (string, error) {
	if !idRE.MatchString(id) {
		return "", fmt.Errorf("request id %q: want <kind>-<generation>-<operation>", id)
	}
	dir, err := d.StatusDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, id+".json"), nil
}

// errContent marks a file that was read but whose content is unusable (as
// opposed to one that could not be read).
var errContent = errors.New("unusable content")

// protocolFile is every file of the protocol: bounded, and 0600 as a
// request may carry a configuration with the join secret. The files are
// at the local paths Dir's methods make (their directories made too).
func protocolFile[T any]() hostroot.StateFile[T] {
	return hostroot.StateFile[T]{Max: maxFile, Perm: 0o600}
}

// readJSON reads the protocol file p: nil when it is absent; one that is
// there but unusable is an error wrapping errContent. No-follow and regular
// only (hostroot.StateFile): a link in requests/ or state/ must not lead a
// worker (root) to read a file outside the host root, and a FIFO must not
// hang it.
func readJSON[T any](p string) (*T, error) {
	v, err := protocolFile[T]().LoadPath(p)
	if ce := (*hostroot.CorruptError)(nil); errors.As(err, &ce) {
		return nil, fmt.Errorf("read %w: %w", err, errContent)
	}
	return v, err
}

// readJSONOrAbsent is readJSON with an absent file an error wrapping
// os.ErrNotExist.
func readJSONOrAbsent[T any](p string) (*T, error) {
	v, err := readJSON[T](p)
	if v == nil && err == nil {
		return nil, fmt.Errorf("read %s: %w", p, os.ErrNotExist)
	}
	return v, err
}

func writeJSON[T any](p string, v *T) error { return protocolFile[T]().SavePath(p, v) }

// ErrInvalid marks a request file no worker can use: not JSON, too large,
// not a request of its file's kind, or missing what its kind needs. Such a
// file is moved aside (Claim, SweepRefused), never retried.
var ErrInvalid = errors.New("not a usable request")

type invalidError struct {
	path string
	err  error
}

func (e *invalidError) Error() string        { return e.path + ": " + e.err.Error() }
func (e *invalidError) Unwrap() error        { return e.err }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

// readRequest reads the request file p of kind. A file that exists but
// cannot be used is an error wrapping ErrInvalid; the request is returned
// alongside when its JSON parsed, so that a rejection can name its ID.
func readRequest(p string, kind Kind) (*Request, error) {
	r, err := readJSONOrAbsent[Request](p)
	if err != nil {
		if errors.Is(err, errContent) {
			return nil, &invalidError{p, err}
		}
		return nil, err
	}
	if err := r.validate(); err != nil {
		return r, &invalidError{p, err}
	}
	if r.Kind != kind {
		return r, &invalidError{p, fmt.Errorf("holds a %s request (%s), not a %s request", r.Kind, r.ID, kind)}
	}
	return r, nil
}

// ReadFile reads one request file of kind without changing anything (for
// kubeslot status); an unusable one is an error wrapping ErrInvalid.
func ReadFile(p string, kind Kind) (*Request, error) {
	r, err := readRequest(p, kind)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Pending returns the unclaimed request of kind, or nil.
func (d *Dir) Pending(kind Kind) (*Request, error) { return d.readAt(d.RequestPath, kind) }

// Claimed returns the claimed request of kind, or nil.
func (d *Dir) Claimed(kind Kind) (*Request, error) { return d.readAt(d.ClaimedPath, kind) }

// readAt reads the request of kind at the path where names it; no file is
// nil.
func (d *Dir) readAt(where func(Kind) (string, error), kind Kind) (*Request, error) {
	p, err := where(kind)
	if err != nil {
		return nil, err
	}
	r, err := ReadFile(p, kind)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return r, err
}

// Write drops r as the pending request of its kind. It does nothing and
// returns false when r's ID is already pending or claimed; it replaces a
// pending request with another ID (not yet claimed, so nothing ran it).
func (d *Dir) Write(r *Request) (bool, error) {
	if err := r.validate(); err != nil {
		return false, err
	}
	if c, err := d.Claimed(r.Kind); err == nil && c != nil && c.ID == r.ID {
		return false, nil
	}
	if p, err := d.Pending(r.Kind); err == nil && p != nil && p.ID == r.ID {
		return false, nil
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = time.Now().UTC()
	}
	p, err := d.RequestPath(r.Kind)
	if err != nil {
		return false, err
	}
	return true, writeJSON(p, r)
}

// ErrNoRequest means there is nothing to claim (RefusedError wraps it when
// what there was had to be moved aside).
var ErrNoRequest = errors.New("no request")

// Claim takes the request of kind for the holder of lock: a request claimed
// earlier by a run that did not finish it comes first (resume), else the
// pending one is renamed into state/. It wraps ErrNoRequest when there is
// none.
func (d *Dir) Claim(lock *ownership.Lock, kind Kind) (*Request, error) {
	if lock == nil {
		return nil, fmt.Errorf("claim %s request: the installation lock must be held", kind)
	}
	if !kind.Valid() {
		return nil, fmt.Errorf("claim request: kind %q: not one of repave, restart, upgrade, reset", kind)
	}
	refused, err := d.SweepRefused(lock, kind)
	if err != nil {
		return nil, fmt.Errorf("claim %s request: %w", kind, err)
	}
	if c, err := d.Claimed(kind); err != nil || c != nil {
		return c, err
	}
	none := func() error {
		if len(refused) > 0 {
			return &RefusedError{Kind: kind, Refused: refused}
		}
		return fmt.Errorf("claim %s request: %w", kind, ErrNoRequest)
	}
	src, err := d.RequestPath(kind)
	if err != nil {
		return nil, err
	}
	dst, err := d.ClaimedPath(kind)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, none()
		}
		return nil, fmt.Errorf("claim %s request: %w", kind, err)
	}
	if err := atomicfile.Rename(src, dst); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, none()
		}
		return nil, fmt.Errorf("claim %s request: %w", kind, err)
	}
	r, err := readRequest(dst, kind)
	if errors.Is(err, ErrInvalid) {
		// Replaced between the sweep and the rename: refuse it the same way.
		ref, rerr := d.reject(kind, dst, r, err)
		if rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		refused = append(refused, ref)
		return nil, none()
	}
	return r, err
}

// rejectedPrefix names the moved-aside request files in state/.
const rejectedPrefix = "rejected-"

// reject moves the request file p of kind aside into
// state/rejected-<kind>-<request|claimed>-<nanoseconds>.json (kept, for a
// person to read) and, when r names a request ID of its own kind that has
// no final status yet, writes a Failed status for it saying why.
func (d *Dir) reject(kind Kind, p string, r *Request, why error) (Refused, error) {
	dir, err := d.dir(hostroot.StateDir)
	if err != nil {
		return Refused{}, err
	}
	from, rel := "request", hostroot.RequestsDir+"/"+filepath.Base(p)
	if strings.HasPrefix(filepath.Base(p), "claimed-") {
		from, rel = "claimed", hostroot.StateDir+"/"+filepath.Base(p)
	}
	name := fmt.Sprintf("%s%s-%s-%d.json", rejectedPrefix, kind, from, time.Now().UnixNano())
	if err := atomicfile.Rename(p, filepath.Join(dir, name)); err != nil {
		return Refused{}, fmt.Errorf("move the unusable request %s aside: %w", p, err)
	}
	reason := why.Error()
	var ie *invalidError
	if errors.As(why, &ie) {
		reason = ie.err.Error()
	}
	ref := Refused{Kind: kind, File: rel, MovedTo: hostroot.StateDir + "/" + name, Reason: reason}
	if r != nil {
		ref.RequestID = r.ID
	}
	if r == nil || !r.Kind.Valid() || !idRE.MatchString(r.ID) || !strings.HasPrefix(r.ID, string(r.Kind)+"-") {
		return ref, nil
	}
	if prev, err := d.ReadStatus(r.ID); err == nil && prev.Phase.Finished() {
		return ref, nil
	}
	return ref, d.WriteStatus(&Status{RequestID: r.ID, Kind: r.Kind, Operation: r.Operation, MachineGeneration: r.MachineGeneration,
		Phase: Failed, Message: fmt.Sprintf("request refused: %s %s; moved aside to %s", rel, reason, ref.MovedTo)})
}

// RejectedFile is a request file moved aside because no worker could use it.
type RejectedFile struct {
	Name string // in state/
	Path string // local path
}

// Rejected lists the request files moved aside, oldest first.
func (d *Dir) Rejected() ([]RejectedFile, error) {
	dir, err := d.dir(hostroot.StateDir)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []RejectedFile
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), rejectedPrefix) && strings.HasSuffix(e.Name(), ".json") {
			out = append(out, RejectedFile{Name: e.Name(), Path: filepath.Join(dir, e.Name())})
		}
	}
	return out, nil
}

// Finish removes the claimed request of kind; call it after the final
// status is written.
func (d *Dir) Finish(lock *ownership.Lock, kind Kind) error {
	if lock == nil {
		return fmt.Errorf("finish %s request: the installation lock must be held", kind)
	}
	p, err := d.ClaimedPath(kind)
	if err != nil {
		return err
	}
	return atomicfile.Remove(p)
}
