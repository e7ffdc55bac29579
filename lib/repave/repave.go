// Package repave is the repaver stage's logic: moving the node from the
// active slot onto the other one as a durable transition of ordered, named,
// idempotent phases (prepare → standby → drain → switch → start → verify →
// commit → uncordon → clean, or rollback), and restarting the node in
// place. Imported only by cmd/kubeslot-repaver (and its tests).
//
// The transition lives in <base>/state/repave.json (lib/repave/repavestate),
// written (atomically) BEFORE each phase runs, so a repaver started after a
// crash resumes the phase it was in. The phases are a table run by
// lib/transition (state and progress status saved, test pause, "repave
// phase started/done" logs, timings kept in the state, failed phases
// included; a failure in switch, start or verify goes to rollback).
//
// Rules kept (DESIGN.md): the running node is untouched until the target
// slot is fully prepared; the applied configuration and applied/active name
// the target only after its node passed verification (kubelet healthy and
// the Node Ready with a heartbeat newer than the switch); the old slot is
// kept until commit, and a start or verify failure rolls back to it.
//
// The repave, step by step (moved here from DESIGN.md, which keeps the rules
// and the state machine):
//
// The repaver takes the lock (busy: 69), defers unless the installation is
// complete, resumes an interrupted repave from state/repave.json, else
// claims the request (or, by hand, rebuilds the active applied configuration,
// or --config, onto the target). Phases, the state written before each:
//
//	prepare          provision and configure the target; the running node is
//	                 untouched, so a bad rootfs fails here and nothing stops.
//	                 Before anything is fetched: the version skew check
//	                 (lib/slot), the sandbox image if it changed, the
//	                 kubelet's digest pinned
//	standby          boot the target's machine warm (no kubelet yet)
//	drain            cordon the Node and evict its pods (lib/drain) with
//	                 the request's policy; a failure rolls back, and the
//	                 old node was never stopped
//	switch           stop the old node
//	start            boot the target with the kept identity
//	verify           kubelet healthy, Node Ready as posted by the kubelet
//	                 that runs in the target (lib/nodeclient), within
//	                 timeouts.node_ready; the kubelet binary and the Node's
//	                 reported version are the desired release
//	commit           the target's applied configuration, then active, then
//	                 the systemd-nspawn@<slot> boot link
//	uncordon         the Node schedulable again, if kubeslot cordoned it
//	                 (best effort: a failure is a warning)
//	clean            remove the old slot
//	rollback         (start or verify failed) stop the target, start the old
//	                 slot, kept until commit
//	rollback-verify  start the old slot again if a reboot came in between,
//	                 wait for its Node, uncordon it, remove the target;
//	                 then Failed
//
// Status files carry phases, durations and the measured node downtime.
// --restart restarts the active node in place through its mode's operator.
//
// A slot is prepared from a clean tree of the rootfs digest, unpacked once
// into <base>/cache/trees/<sha256>/ (staged, marker written last, renamed,
// never changed) and copied file by file in Go (FICLONE where the filesystem
// has it, else copy_file_range; modes, owners, times and links kept; one
// syncfs), instead of unpacking the tarball each time.
//
// After commit (and after a restart in place) the repaver patches the Node's
// labels, as the node, to the configuration's (the kubelet applies
// --node-labels only at registration), removing those the previous applied
// configuration had and the new one dropped; a failure there is a warning in
// the status, not a rollback.
//
// kubeslot-repave.path also watches state/repave.json, so a repave
// interrupted by a reboot or a kill resumes by itself. A resume in verify or
// commit goes back to start (stop the old node, start the target, verify):
// after a power cut the old slot boots (its boot link moves only at the end
// of commit), and nothing is committed that is not running and verified; if
// the target then fails, the rollback also takes back what the interrupted
// commit did. A SIGTERM (a shutdown) keeps the state: the repave resumes
// after the next start. At its start, and after a committed repave, the
// repaver prunes the artifact cache (lib/cachekeep). A request whose ID
// already has a final status is finished without running again.
package repave

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/cri"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/repave/repavestate"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/state"
)

// Phase is one step of the repave transition (lib/repave/repavestate).
type Phase = repavestate.Phase

// Phases of a repave, in order, and the rollback.
const (
	Prepare        = repavestate.Prepare
	Standby        = repavestate.Standby
	Drain          = repavestate.Drain
	Switch         = repavestate.Switch
	Start          = repavestate.Start
	Verify         = repavestate.Verify
	Commit         = repavestate.Commit
	Uncordon       = repavestate.Uncordon
	Clean          = repavestate.Clean
	Rollback       = repavestate.Rollback
	RollbackVerify = repavestate.RollbackVerify
	RestartNode    = repavestate.RestartNode
	PatchKubelet   = repavestate.PatchKubelet
)

// Phases lists the forward phases in order.
func Phases() []Phase { return repavestate.Phases() }

// Pausable names what the test hook KUBESLOT_TEST_PAUSE_AT may pause
// before (lib/stagekit): any Valid phase; the run stops before it, its
// state written, and waits to be killed.
func Pausable() []string {
	var names []string
	for _, p := range repavestate.AllPhases() {
		names = append(names, string(p))
	}
	return names
}

// State is the durable repave transition (lib/repave/repavestate).
type State = repavestate.State

// LoadState reads the transition; (nil, nil) when there is none.
func LoadState(root *hostroot.Root) (*State, error) { return repavestate.File.Load(root) }

func saveState(root *hostroot.Root, st *State) error { return repavestate.File.Save(root, st) }

func removeState(root *hostroot.Root) error { return repavestate.File.Remove(root) }

// Cluster is what the repaver asks of the control plane, always as the
// node's own identity: what the slot's tasks ask, and the Node's labels.
// lib/nodeclient's Client is the real one.
type Cluster interface {
	slot.Cluster
	// SetLabels makes cfg's Node carry the labels set and not those named
	// in drop, acting as the node itself; other labels are left alone.
	// The kubelet applies --node-labels only when it registers a Node, and
	// a repave keeps the Node: this is how a changed label reaches it.
	SetLabels(ctx context.Context, cfg *config.Config, set map[string]string, drop []string) error
}

// labelTimeout bounds the label update after a commit or restart.
const labelTimeout = 30 * time.Second

// syncLabels sets cfg's node labels on its Node and removes those of prev
// (what kubeslot set before: the previous applied configuration's labels)
// that cfg no longer has. It is best effort: the node already runs from cfg
// and passed verification; a failure is returned as a warning for the
// status, not a reason to undo anything.
func (d *Deps) syncLabels(ctx context.Context, cfg *config.Config, prev map[string]string) string {
	set := cfg.Kubernetes.Labels
	var drop []string
	for k := range prev {
		if _, ok := set[k]; !ok {
			drop = append(drop, k)
		}
	}
	slices.Sort(drop)
	lctx, cancel := context.WithTimeoutCause(ctx, labelTimeout, fmt.Errorf("node labels not updated within %s", labelTimeout))
	defer cancel()
	if err := d.Cluster.SetLabels(lctx, cfg, set, drop); err != nil {
		d.Log.Warn("could not update the Node's labels", "node", cfg.Machine.NodeName, "err", err)
		return "the Node's labels were not updated: " + err.Error()
	}
	d.Log.Info("Node labels updated", "node", cfg.Machine.NodeName, "set", len(set), "removed", drop)
	return ""
}

// Boot moves the node's start-at-boot link (slot.BootLinks is the real
// one).
type Boot interface {
	// Move makes slot to's node start at host boot and slot from's not.
	Move(ctx context.Context, from, to string) error
}

// Deps are the repaver's collaborators; tests pass fakes.
type Deps struct {
	// background is the work a phase started that the stage waits for
	// before it ends (removeDeadSandboxes).
	background sync.WaitGroup
	// DialCRI connects to a node's CRI socket; nil is cri.Dial.
	DialCRI  func(socket string) (cri.Runtime, io.Closer, error)
	Root     *hostroot.Root
	Log      *slog.Logger
	Store    *state.Store
	Requests *requests.Dir
	// Isolation builds the backend and operator of mode for cfg.
	Isolation func(mode isolation.Mode, cfg *config.Config) (isolation.Backend, isolation.Operator, error)
	Cluster   Cluster
	Releases  slot.Releases
	// SandboxImage checks that the node can get cfg's sandbox image (a
	// registry through the mirrors serves it, or it is preloaded); nil
	// checks nothing.
	SandboxImage func(ctx context.Context, cfg *config.Config) error
	Boot         Boot
	// Drain builds the cluster side of the node's drain (lib/drain) for
	// cfg's node, as the node itself.
	Drain func(cfg *config.Config) (drain.Cluster, error)
	// DrainPoll is the drain's pause between passes (0: 1 s);
	// UncordonWait bounds an uncordon (0: 30 s).
	DrainPoll, UncordonWait time.Duration
	AgentVersion            string
	// Pause runs after the state of a phase is written and before the
	// phase runs (the test hook KUBESLOT_TEST_PAUSE_AT, Pausable); an
	// error aborts the run as a crash would, leaving the state for a resume.
	Pause func(ctx context.Context, phase string) error
	// Poll is the pause between two asks of a wait (0: slot.Tasks').
	Poll time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

func (d *Deps) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// tasks are the slot's tasks (lib/slot) with the repaver's collaborators.
func (d *Deps) tasks() *slot.Tasks {
	return &slot.Tasks{Log: d.Log, Cluster: d.Cluster, Poll: d.Poll}
}

// backend builds the backend of cfg's own mode.
func (d *Deps) backend(cfg *config.Config) (isolation.Backend, error) {
	m, err := isolation.ParseMode(cfg.Isolation.Mode)
	if err != nil {
		return nil, err
	}
	b, _, err := d.Isolation(m, cfg)
	return b, err
}

// oldConfig is the old slot's applied configuration: what its node was
// built from and must be restarted with.
func (d *Deps) oldBackend(st *State) (isolation.Backend, error) {
	a, err := d.Store.LoadApplied(st.From)
	if errors.Is(err, state.ErrNotFound) {
		// Clean already removed it: only Remove (absent is fine) is
		// left, and the target's configuration names the same slots.
		return d.backend(st.Desired)
	}
	if err != nil {
		return nil, err
	}
	m, err := isolation.AppliedMode(a)
	if err != nil {
		return nil, err
	}
	b, _, err := d.Isolation(m, a.Config)
	return b, err
}

// waitNode waits for slot's kubelet health and the Node Ready as posted by
// that kubelet (slot.Tasks.WaitReady), both inside the downtime, then
// starts removing the pod sandboxes the stopped node left dead.
func (d *Deps) waitNode(ctx context.Context, b isolation.Backend, cfg *config.Config, name string) error {
	since, err := d.tasks().WaitReady(ctx, b, cfg, name)
	if err != nil {
		return err
	}
	// Healthy and Ready: past its start-up and its first Node status, in
	// its first sync's fixed wait, so the removal's CNI work takes no CPU
	// from either (started at the health check, it still overlapped the
	// kubelet's registration and first status on 2 CPUs).
	d.removeDeadSandboxes(ctx, b, name, since)
	return nil
}

// deadSandboxBound bounds the removal of a stopped node's dead pod
// sandboxes (each CRI call has its own bound too). It runs beside verify,
// whose node_ready bound covers it; what it may run past the stage's last
// phase fits in the margin between config.StageBudget and the unit's
// TimeoutStartSec.
const deadSandboxBound = 30 * time.Second

// removeDeadSandboxes starts removing, at the end of the wait for the node,
// the pod sandboxes that the node's stopped run left dead (those created
// before its kubelet started; lib/cri), when b's node has a CRI socket the
// host reaches (isolation.CRIEndpoint): once the new kubelet is healthy and
// Ready, while it waits for its first sync, neither in its start-up nor in
// its pods' path.
// The stage waits for it before it ends (Deps.background). A failure is
// only logged: the kubelet removes what is left itself, later.
func (d *Deps) removeDeadSandboxes(ctx context.Context, b isolation.Backend, slot string, kubeletStarted time.Time) {
	e, ok := b.(isolation.CRIEndpoint)
	if !ok {
		return
	}
	d.background.Go(func() {
		rctx, cancel := context.WithTimeout(ctx, deadSandboxBound)
		defer cancel()
		t0 := time.Now()
		res, err := d.removeDead(rctx, e, slot, kubeletStarted)
		if err != nil {
			d.Log.Warn("could not remove every dead pod sandbox of the stopped node; the kubelet removes the rest", "slot", slot,
				"found", res.Found, "removed", res.Removed, "err", err)
			return
		}
		d.Log.Info("dead pod sandboxes of the stopped node removed", "slot", slot, "removed", res.Removed, "took", time.Since(t0).Round(time.Millisecond))
	})
}

func (d *Deps) removeDead(ctx context.Context, e isolation.CRIEndpoint, slot string, before time.Time) (cri.Removed, error) {
	socket, err := e.CRISocket(ctx, slot)
	if err != nil {
		return cri.Removed{}, err
	}
	dial := d.DialCRI
	if dial == nil {
		dial = cri.Dial
	}
	rt, conn, err := dial(socket)
	if err != nil {
		return cri.Removed{}, err
	}
	defer conn.Close()
	return cri.RemoveDead(ctx, rt, before, d.Log.With("slot", slot))
}
