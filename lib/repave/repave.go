// Package repave is the repaver stage's logic: moving the node from the
// active slot onto the other one as a durable transition of ordered, named,
// idempotent phases (prepare → standby → drain → switch → start → verify →
// commit → uncordon → clean, or rollback), and restarting the node in
// place. Imported only by cmd/kubeslot-repaver (and its tests).
//
// The transition lives in <base>/state/repave.json, written (atomically)
// BEFORE each phase runs, so a repaver started after a crash resumes the
// phase it was in. The phases are a table run by lib/transition (state and
// progress status saved, test pause, "repave phase started/done" logs,
// timings kept in the state, failed phases included; a failure in switch,
// start or verify goes to rollback). The file is a plain atomic JSON file rather than a
// checksummed pair: it is rewritten at every phase, and a crash between a
// data file and its sidecar would leave a mismatch that blocks the resume,
// while an atomic rename leaves either the old or the new state.
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
//	                 (lib/kuberelease), the sandbox image if it changed, the
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
	"io/fs"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/cri"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
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
)

// Phases lists the forward phases in order.
func Phases() []Phase {
	return []Phase{Prepare, Standby, Drain, Switch, Start, Verify, Commit, Uncordon, Clean}
}

// allPhases are the forward phases, the rollback's and the restart's.
func allPhases() []Phase { return append(Phases(), Rollback, RollbackVerify, RestartNode) }

// Valid reports whether p is a forward phase or a rollback phase.
func (p Phase) Valid() bool { return slices.Contains(allPhases(), p) }

// Pausable names what the test hook KUBESLOT_TEST_PAUSE_AT may pause
// before (lib/stagekit): any Valid phase; the run stops before it, its
// state written, and waits to be killed.
func Pausable() []string {
	var names []string
	for _, p := range allPhases() {
		names = append(names, string(p))
	}
	return names
}

// StateFile is the transition's file name in <base>/state/.
const StateFile = hostroot.RepaveStateFile

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

func statePath(root *hostroot.Root) (string, error) {
	return root.File(hostroot.StateDir, StateFile)
}

// LoadState reads the transition; (nil, nil) when there is none.
func LoadState(root *hostroot.Root) (*State, error) {
	p, err := statePath(root)
	if err != nil {
		return nil, err
	}
	var st State
	err = hostroot.ReadJSON(p, state.MaxChecksummed, &st)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if errors.Is(err, hostroot.ErrNotJSON) {
		return nil, fmt.Errorf("repave state %w; remove it only after checking which slot runs", err)
	}
	if err != nil {
		return nil, fmt.Errorf("repave state: %w", err)
	}
	if !st.Phase.Valid() || st.From == "" || st.To == "" || st.From == st.To || st.Desired == nil || st.RequestID == "" {
		return nil, fmt.Errorf("repave state %s: phase %q, from %q, to %q, request %q: incomplete or invalid", p, st.Phase, st.From, st.To, st.RequestID)
	}
	return &st, nil
}

func saveState(root *hostroot.Root, st *State) error {
	p, err := statePath(root)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteJSON(p, st, 0o600); err != nil {
		return fmt.Errorf("repave state: %w", err)
	}
	return nil
}

func removeState(root *hostroot.Root) error {
	p, err := statePath(root)
	if err != nil {
		return err
	}
	return atomicfile.Remove(p)
}

// Cluster is what the repaver asks of the control plane, always as the
// node's own identity: lib/nodeclient's Client is the real one.
type Cluster interface {
	// WaitReady waits until cfg's Node is Ready as posted by a kubelet
	// started at since or later, bounded by ctx.
	WaitReady(ctx context.Context, cfg *config.Config, since time.Time) error
	// SetLabels makes cfg's Node carry the labels set and not those named
	// in drop, acting as the node itself; other labels are left alone.
	// The kubelet applies --node-labels only when it registers a Node, and
	// a repave keeps the Node: this is how a changed label reaches it.
	SetLabels(ctx context.Context, cfg *config.Config, set map[string]string, drop []string) error
	// ServerVersion is the API server's version (/version's gitVersion).
	ServerVersion(ctx context.Context, cfg *config.Config) (string, error)
	// KubeletVersion is the kubelet version cfg's Node reports
	// (status.nodeInfo.kubeletVersion, e.g. "v1.37.2").
	KubeletVersion(ctx context.Context, cfg *config.Config) (string, error)
}

// Releases finds what a Kubernetes version installs.
type Releases interface {
	// Pin records in cfg the kubelet of its version on its release mirror
	// (kuberelease.Pin); a no-op for an explicit kubelet or one pinned.
	Pin(ctx context.Context, cfg *config.Config) error
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

// Boot moves the node's start-at-boot link.
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
	Releases  Releases
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
	// Poll is the health poll interval (0: 200 ms).
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

func (d *Deps) poll() time.Duration {
	if d.Poll > 0 {
		return d.Poll
	}
	return 50 * time.Millisecond // a local healthz GET; inside the downtime
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
// that kubelet (a heartbeat since it started: never the status the old
// slot's kubelet, or an earlier run of this one, left), together bounded by
// cfg's timeouts.node_ready. The two waits run side by side, both inside
// the downtime. Taking the floor from the running kubelet rather than from
// a time this process noted makes a resumed wait (after a kill or a reboot,
// with the kubelet already up) finish too.
func (d *Deps) waitNode(ctx context.Context, b isolation.Backend, cfg *config.Config, slot string) error {
	bound := cfg.Timeouts.NodeReady.Duration
	if bound <= 0 {
		bound = config.DefaultNodeReady
	}
	wctx, cancel := context.WithTimeoutCause(ctx, bound,
		fmt.Errorf("node of slot %s not Ready within %s (timeouts.node_ready)", slot, bound))
	defer cancel()
	since, err := retry(wctx, d.poll(), func() (time.Time, error) { return b.KubeletStartedAt(wctx, slot) })
	if err != nil {
		return fmt.Errorf("kubelet of slot %s never started: %w", slot, err)
	}
	d.Log.Info("kubelet started; waiting for its health and Node status", "slot", slot, "kubeletStarted", since.UTC().Format(time.RFC3339Nano))
	healthy := make(chan error, 1)
	go func() {
		_, err := retry(wctx, d.poll(), func() (struct{}, error) { return struct{}{}, b.KubeletHealthy(wctx, slot) })
		healthy <- err
	}()
	if err := d.Cluster.WaitReady(wctx, cfg, since); err != nil {
		cancel()
		<-healthy
		return err
	}
	if err := <-healthy; err != nil {
		return fmt.Errorf("kubelet of slot %s never healthy: %w", slot, err)
	}
	// Healthy and Ready: past its start-up and its first Node status, in
	// its first sync's fixed wait, so the removal's CNI work takes no CPU
	// from either (started at the health check, it still overlapped the
	// kubelet's registration and first status on 2 CPUs).
	d.removeDeadSandboxes(ctx, b, slot, since)
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

// retry calls f every poll until it succeeds or ctx is done; the error
// then names ctx's cause and f's last failure.
func retry[T any](ctx context.Context, poll time.Duration, f func() (T, error)) (T, error) {
	for {
		v, err := f()
		if err == nil {
			return v, nil
		}
		select {
		case <-ctx.Done():
			var zero T
			return zero, fmt.Errorf("%w; last: %v", context.Cause(ctx), err)
		case <-time.After(poll):
		}
	}
}
