// Package bootstrap is the logic of the bootstrap stage (cmd/kubeslot-bootstrap):
// admission through the ownership record, then the checkpointed phases
// preparing-host → preparing-slot → starting-node → installing-units →
// complete, and the verify-and-repair run of a complete host. The host, the
// isolation backend, the cluster and the release install are reached
// through narrow interfaces (Host, NewIsolation, Cluster, Releaser) so that
// the phase logic is tested with fakes on a temporary root; Real builds the
// production ones.
//
// The slot's own tasks (skew check, sandbox image, provision and configure,
// ready, commit, boot link) are lib/slot's, shared with the repaver.
//
// Imported by cmd/kubeslot-bootstrap (and the rig's tests, for the sandbox
// settings' names); by no lib/ package.
// Never by the watcher: this package links client-go's typed clientset,
// which the watcher must stay without; what the stages share
// with it lives in lib/sandbox, lib/systemdconn and lib/nodeidentity.
//
// The bootstrap, step by step (moved here from DESIGN.md, which keeps the
// rules and the state machine):
//
//   - Load and validate the configuration: invalid is exit 1, the host
//     untouched.
//   - On a fresh host, check the sandbox image before anything (the lock
//     included) is made: preloaded (an oci:// preload of that image, or image
//     archives, known only once downloaded), else a HEAD of its manifest
//     through node.registry_mirrors, then its registry (oci.Resolve,
//     anonymous, 20 s). Not found or unreachable is exit 1 naming
//     node.sandbox_image and what each endpoint answered; --preflight prints
//     the same as "sandbox image: BLOCKED".
//   - On a fresh host, survey host preparation too (lib/hostprep): a blocked
//     plan (software missing on an image-based host, a package it may not
//     install) is exit 78 (exitcode.HostUnfit), the host untouched, naming
//     the distribution detected and every missing thing.
//   - The installation lock (busy: 69), then admission through the ownership
//     record: fresh, resume from the checkpoint, refuse a different
//     configuration (on a complete host: unless it differs from the applied
//     one only in settings the Machine spec governs, edited.go), or
//     (complete) verify and repair.
//   - preparing-host (lib/hostprep) → preparing-slot (provision and configure
//     slot a) → starting-node (start, kubelet healthy, Node Ready within
//     timeouts.node_ready, the release the binary and the Node report;
//     systemd-nspawn@a enabled at boot) →
//     installing-units (the release into <base>/releases/blue and current,
//     unless a usable one is there; every unit file, journalled first; then
//     the commit: slot a's applied configuration, then applied/active) →
//     complete → the watcher and path units started once the lock is
//     released.
//
// A complete host's re-run (every boot) re-applies host preparation, runs
// lib/verify's checks and repairs exactly what they name, each repair (or
// the reason a finding is left) logged on its own line (repair.go), ensures
// the slot's lifecycle hooks from the applied configuration, and changes
// nothing else. Enable links are written as files (not EnableUnitFiles), so
// each is journalled before it exists.
//
// Reports go to the Machine (AgentBootstrapped: Running with the phase,
// Succeeded, or <Phase>Failed with a message of at most 1 KiB) with the
// node's own identity, never the bootstrap token: a token names no node, so
// widening access for it would let any holder write any Machine. Before the
// kubelet has its certificate, reports are only logged.
//
// Sandbox settings (lib/sandbox) come from the environment:
// KUBESLOT_NODE_KUBELET_PORT, KUBESLOT_NODE_HEALTHZ_PORT, KUBESLOT_NODE_IP,
// KUBESLOT_NODE_READONLY_NET_SYSCTL=1, KUBESLOT_HOSTPREP=packages-only, the
// node compromises KUBESLOT_NODE_LOOPBACK_CNI=1, KUBESLOT_NODE_SNAPSHOTTER,
// KUBESLOT_NODE_RESTRICT_OOM_SCORE_ADJ=1 and
// KUBESLOT_SKIP_SANDBOX_IMAGE_CHECK=1 (the rig's shared-network hosts may
// not reach a public registry and run no pods), and the test hook
// KUBESLOT_TEST_PAUSE_AT=<checkpoint>. The bootstrap records all but the
// hook in <base>/state/sandbox.json (checksummed; none on a production host)
// once it owns the host, and every later run starts from the record with the
// environment overriding it field by field (…_READONLY_NET_SYSCTL=0 and
// KUBESLOT_HOSTPREP=full turn a recorded setting off), so a stage started
// from a unit without that environment keeps the sandbox's settings. Reset
// removes the record with the host root.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/cachekeep"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostprep"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/state"
)

// Stage is the holder name written into the installation lock.
const Stage = "kubeslot-bootstrap"

// Host prepares the host (lib/hostprep over its System).
type Host interface {
	Preflight(ctx context.Context, cfg *config.Config) (*hostprep.Plan, error)
	Apply(ctx context.Context, cfg *config.Config, rec *ownership.Record) error
}

// Cluster is what the stage asks of the control plane, always as the
// node's own identity (see status.go for why): what the slot's tasks ask,
// and the Machine reports.
type Cluster interface {
	slot.Cluster
	// Report writes the AgentBootstrapped condition (best effort: the
	// implementation logs and swallows its own failures, bounded).
	Report(ctx context.Context, cfg *config.Config, r Report)
}

// Releaser installs this release's binaries unless a usable install is
// there (lib/release).
type Releaser interface {
	Ensure(ctx context.Context) error
}

// Deps is everything a run is built from. Root, Log, Begin, Host,
// Systemd, NewIsolation, Cluster and Releaser are required.
type Deps struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// Begin is the stage prologue: the installation lock (busy: 69), then
	// the admission it is given (stagekit.Driver.Begin).
	Begin   func(context.Context, ownership.Prologue) (*ownership.Held, error)
	Host    Host
	Systemd isolation.SystemdConn
	// NewIsolation builds the backend and operator bound to cfg and rec.
	NewIsolation func(cfg *config.Config, rec *ownership.Record) (isolation.Backend, isolation.Operator, error)
	Cluster      Cluster
	Releaser     Releaser
	// Releases pins the kubelet of the configuration's version.
	Releases slot.Releases
	// Pause is the test hook KUBESLOT_TEST_PAUSE_AT (lib/stagekit), called
	// at the start of each phase after its checkpoint is saved, and before
	// complete is written; nil: none.
	Pause func(ctx context.Context, checkpoint string) error
	// Sandbox are the test and sandbox settings this run uses (sandbox.Load:
	// the record, the environment overriding). The run records them in
	// <base>/state/sandbox.json once it owns the host, so later stages
	// started without that environment use them too.
	Sandbox state.Sandbox
	// ResolveImage checks that a registry serves the sandbox image (before a
	// fresh installation touches the host, and at --preflight); nil checks
	// nothing (unit tests of other logic). Real: slot.ResolveImage.
	ResolveImage slot.ImageResolver
	Now          func() time.Time
	// Status tells the service manager where the run is (sd_notify
	// STATUS=, so `systemctl status kubeslot-bootstrap` says it); nil
	// tells nobody.
	Status func(string)
	// ConfigFile is the configuration's host path: in messages ("" is
	// "the configuration"), and the file the join token is removed from
	// once the node has its identity (jointoken.go; "" none).
	ConfigFile string
}

// tasks are the slot's tasks (lib/slot) with this run's collaborators.
func (d *Deps) tasks() *slot.Tasks {
	return &slot.Tasks{Log: d.Log, Cluster: d.Cluster}
}

// checkSkew is the version skew check (slot.Tasks.Skew), asking once: an
// API server that cannot be asked is no reason to stop a bootstrap (it
// waits for the cluster later anyway), so unknown is known=false, no error.
func checkSkew(ctx context.Context, d *Deps, cfg *config.Config) (server string, known bool, err error) {
	server, known, err = d.tasks().Skew(ctx, cfg, 0)
	if err != nil {
		err = fmt.Errorf("kubernetes.version %w", err)
	}
	return server, known, err
}

func (d *Deps) status(format string, args ...any) {
	if d.Status != nil {
		d.Status(fmt.Sprintf(format, args...))
	}
}

func (d *Deps) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// Result says what a run did.
type Result struct {
	Decision   ownership.Decision
	InstallID  string
	Phases     []ownership.Checkpoint // phases run, in order
	Repaired   []string               // what a complete-host run repaired
	Started    []string               // enabled units that were not active and were started
	Checkpoint ownership.Checkpoint
}

// ProtectConfig keeps the join token of the configuration file at path from
// other users: a file others can read or write has those bits removed, with
// a warning; with fix false (--preflight, which changes nothing) it only
// warns. A mode it cannot fix is refused before the host is touched.
func ProtectConfig(path string, cfg *config.Config, fix bool, log *slog.Logger) error {
	mode, exposed, err := config.ExposedMode(path, cfg)
	if err != nil || !exposed {
		return err
	}
	msg := config.ExposureWarning(path, mode)
	if !fix {
		log.Warn("configuration readable by others: the bootstrap will restrict it to 0600", "problem", msg)
		return nil
	}
	if err := os.Chmod(path, mode&^0o077); err != nil {
		return fmt.Errorf("refusing the configuration, nothing was changed on the host: %s, and its mode cannot be fixed: %w", msg, err)
	}
	log.Warn("configuration was readable by others: mode fixed", "path", path, "from", fmt.Sprintf("%04o", mode), "to", fmt.Sprintf("%04o", mode&^0o077))
	return nil
}

// Run is the whole stage for a valid cfg: lock, admission, phases (or the
// verify-and-repair of a complete host), then, with the lock released,
// starting the enabled kubeslot units that are not active: the watcher
// takes the installation lock itself before it reports ready, so it must
// not be started while this run holds it.
func Run(ctx context.Context, d Deps, cfg *config.Config) (*Result, error) {
	// What the node cannot do without, before anything (the lock included)
	// is created on a fresh host. Read-only, so outside the lock: admission
	// is decided again under it.
	if decision, _, err := ownership.Admit(d.Root, cfg.Machine.Name, cfg.Fingerprint()); err == nil && decision == ownership.Fresh &&
		movingFrom(d) == "" {
		if err := checkHostFresh(ctx, d, cfg); err != nil {
			return nil, err
		}
		line, err := slot.CheckSandboxImage(ctx, cfg, d.ResolveImage, slot.ImageCheckSkip(d.Sandbox))
		if err != nil {
			return nil, fmt.Errorf("nothing was changed on the host: %w", err)
		}
		d.Log.Info("sandbox image checked", "result", line)
	}
	res, err := locked(ctx, d, cfg)
	if err != nil {
		return res, err
	}
	res.Started = ensureActive(ctx, d, d.Log, res.Decision == ownership.Complete)
	d.status("complete: installation %s, %s", res.InstallID, completeNote(res))
	switch {
	case res.Decision != ownership.Complete:
	case len(res.Repaired)+len(res.Started) > 0:
		d.Log.Info("complete installation repaired", "install_id", res.InstallID, "repaired", res.Repaired, "started", res.Started)
	default:
		d.Log.Info("complete installation verified: nothing to do", "install_id", res.InstallID)
	}
	return res, nil
}

// completeNote says what the run did to a complete installation.
func completeNote(res *Result) string {
	switch {
	case res.Decision != ownership.Complete:
		return "installed"
	case len(res.Repaired)+len(res.Started) > 0:
		return fmt.Sprintf("verified, %d repaired, %d started", len(res.Repaired), len(res.Started))
	}
	return "verified"
}

// checkHostFresh surveys host preparation on a fresh host before anything
// (lock, layout, ownership record) exists: a host that lacks what kubeslot
// will not provide (software on an image-based host, a package it may not
// install) is refused untouched, with hostprep's error (exit
// exitcode.HostUnfit) naming the distribution and every missing thing.
func checkHostFresh(ctx context.Context, d Deps, cfg *config.Config) error {
	plan, err := d.Host.Preflight(ctx, cfg)
	if err != nil {
		// A survey that cannot be made here is the preparing-host phase's
		// to report, after admission, as it always was.
		d.Log.Debug("host preparation not surveyed before admission", "err", err.Error())
		return nil
	}
	if err := plan.Err(); err != nil {
		return err
	}
	// Info once, by host preparation itself (hostprep.Apply) in its phase.
	d.Log.Debug("host surveyed before admission", "family", plan.Distro.Family, "changes", len(plan.Changes()))
	return nil
}

// locked is the part of Run that holds the installation lock.
func locked(ctx context.Context, d Deps, cfg *config.Config) (*Result, error) {
	res := &Result{}
	held, err := d.Begin(ctx, ownership.Prologue{Stage: Stage, Wait: cfg.Timeouts.Lock.Duration, WaitName: "timeouts.lock",
		Admit: func(rec *ownership.Record, err error) (*ownership.Record, error) {
			rec, err = migrateLegacy(ctx, d, rec, err)
			rec, res.Decision, err = admit(d, cfg, rec, err)
			return rec, err
		}, Log: d.Log})
	if err != nil {
		return nil, err
	}
	defer held.Release()
	rec, decision := held.Record, res.Decision
	res.InstallID = rec.InstallID
	if err := recordSandbox(d); err != nil {
		return res, err
	}
	tidyCache(d, decision)
	if decision == ownership.Complete {
		repaired, err := repair(ctx, d, rec)
		res.Repaired, res.Checkpoint = repaired, rec.Checkpoint
		if err == nil {
			// A host that joined before the token was dropped at the
			// commit, or whose run stopped between the two.
			err = dropCompleteJoinToken(d, cfg)
		}
		return res, err
	}
	r := &runner{d: d, cfg: cfg, rec: rec, log: d.Log.With("install_id", rec.InstallID)}
	err = r.phases(ctx, res)
	res.Checkpoint = rec.Checkpoint
	return res, err
}

// admit is the bootstrap's admission (ownership.Prologue.Admit): the
// record decides (ownership.Decide) between installing afresh, resuming and
// verifying a complete host; a refusal changes nothing. A fresh
// installation's record is made here, before its first host change.
func admit(d Deps, cfg *config.Config, rec *ownership.Record, err error) (*ownership.Record, ownership.Decision, error) {
	var decision ownership.Decision
	if err == nil {
		decision, err = ownership.Decide(d.Root, rec, cfg.Machine.Name, cfg.Fingerprint())
	}
	if errors.Is(err, ownership.ErrDifferentInstallation) {
		decision, err = editedConfig(d, cfg, rec, err) // edited.go
	}
	if err != nil {
		return nil, 0, fmt.Errorf("admission refused, nothing was changed: %w", err)
	}
	switch decision {
	case ownership.Fresh:
		if err := d.Root.EnsureLayout(); err != nil {
			return nil, 0, err
		}
		if rec, err = ownership.New(cfg.Machine.Name, cfg.Fingerprint(), buildinfo.Version); err != nil {
			return nil, 0, err
		}
		if err := ownership.Save(d.Root, rec); err != nil {
			return nil, 0, err
		}
		d.Log.Info("fresh installation", "install_id", rec.InstallID, "machine", rec.Machine)
	case ownership.Resume:
		if err := d.Root.EnsureLayout(); err != nil {
			return nil, 0, err
		}
		d.Log.Info("resuming installation", "install_id", rec.InstallID, "checkpoint", rec.Checkpoint)
	}
	return rec, decision, nil
}

// tidyCache removes, under the lock, what killed downloads left in the
// artifact cache; on a complete host also the entries nothing uses
// (lib/cachekeep). An installation still in progress keeps every entry: the
// slot it builds is not applied yet, and a resumed phase uses its
// downloads. A failure costs only disk, and is logged.
func tidyCache(d Deps, decision ownership.Decision) {
	var err error
	if decision == ownership.Complete {
		err = cachekeep.Prune(d.Root, d.Log)
	} else {
		err = artifact.RemoveStale(d.Root, d.Log)
	}
	if err != nil {
		d.Log.Warn("artifact cache not tidied", "err", err.Error())
	}
}

// recordSandbox saves d.Sandbox when it differs from the record (a run
// without sandbox settings on a host that has none writes nothing).
func recordSandbox(d Deps) error {
	st := state.NewStore(d.Root)
	rec, err := st.LoadSandbox()
	if err != nil {
		return fmt.Errorf("test and sandbox settings: %w", err)
	}
	if rec == d.Sandbox {
		return nil
	}
	if err := st.SaveSandbox(d.Sandbox); err != nil {
		return fmt.Errorf("record the test and sandbox settings: %w", err)
	}
	d.Log.Info("test and sandbox settings recorded for later stages", "settings", fmt.Sprintf("%+v", d.Sandbox))
	return nil
}

// Preflight writes what a run would do and what is missing to w, changing
// nothing (no lock, no layout). It returns an error when the run could not
// proceed: admission refused or a host preparation step blocked.
func Preflight(ctx context.Context, d Deps, cfg *config.Config, w io.Writer) error {
	var problems []string
	fmt.Fprintf(w, "configuration: valid (%s; fingerprint %s)\n", cfg.Summary(), ownership.ShortFingerprint(cfg.Fingerprint()))
	decision, rec, err := ownership.Admit(d.Root, cfg.Machine.Name, cfg.Fingerprint())
	if errors.Is(err, ownership.ErrDifferentInstallation) {
		decision, err = editedConfig(d, cfg, rec, err)
	}
	switch {
	case err != nil:
		fmt.Fprintf(w, "admission: BLOCKED: %v\n", err)
		problems = append(problems, "admission")
	case decision == ownership.Fresh && movingFrom(d) != "":
		fmt.Fprintf(w, "admission: change: the installation at %s would be moved to %s, then verified and repaired\n", movingFrom(d), d.Root.Base())
	case decision == ownership.Fresh:
		fmt.Fprintf(w, "admission: fresh installation of machine %q in %s\n", cfg.Machine.Name, d.Root.Base())
	case decision == ownership.Resume:
		fmt.Fprintf(w, "admission: resume installation %s from checkpoint %s\n", rec.InstallID, rec.Checkpoint)
	default:
		fmt.Fprintf(w, "admission: installation %s is complete: a run repairs what kubeslot verify names\n", rec.InstallID)
	}
	name := cfg.Isolation.Slots[0]
	if p, err := d.Root.Machine(name); err == nil {
		if _, err := os.Stat(p); err == nil {
			fmt.Fprintf(w, "slot %s: %s exists\n", name, path.Join(hostroot.MachinesDir, name))
		} else {
			fmt.Fprintf(w, "slot %s: change: %s would be provisioned from %s\n", name, path.Join(hostroot.MachinesDir, name), artifact.Redact(cfg.RootFS.Source))
		}
	}
	fmt.Fprintf(w, "node cgroups: %s\n", nodeconfig.DetectCgroups(d.Root).Note())
	if mode, err := isolation.ParseMode(cfg.Isolation.Mode); err == nil {
		switch mech, why := mode.ProbeRootfs(d.Root); {
		case mech == "":
		case why == "":
			fmt.Fprintf(w, "slot rootfs: %s (the trial mount worked)\n", mech)
		default:
			fmt.Fprintf(w, "slot rootfs: %s, no fast path: %s\n", mech, why)
		}
	}
	switch server, known, err := checkSkew(ctx, &d, cfg); {
	case err != nil:
		fmt.Fprintf(w, "kubernetes version: BLOCKED: %v\n", err)
		problems = append(problems, "kubernetes version")
	case known:
		fmt.Fprintf(w, "kubernetes version: %s, API server %s: within the version skew policy\n", cfg.Kubernetes.Version, server)
	default:
		fmt.Fprintf(w, "kubernetes version: %s, API server not reachable to check the skew policy (%s)\n", cfg.Kubernetes.Version, server)
	}
	if line, err := slot.CheckSandboxImage(ctx, cfg, d.ResolveImage, slot.ImageCheckSkip(d.Sandbox)); err != nil {
		fmt.Fprintf(w, "sandbox image: BLOCKED: %v\n", err)
		problems = append(problems, "sandbox image")
	} else {
		fmt.Fprintf(w, "sandbox image: %s\n", line)
	}
	plan, perr := d.Host.Preflight(ctx, cfg)
	if perr != nil {
		return fmt.Errorf("host preflight: %w", perr)
	}
	fmt.Fprintf(w, "host distribution: %s\n", plan.Distro)
	fmt.Fprintf(w, "host preparation:\n%s", plan.String())
	if len(plan.Blocked()) > 0 {
		problems = append(problems, "host preparation")
	}
	if len(problems) > 0 {
		fmt.Fprintf(w, "preflight: BLOCKED (%s); nothing was changed\n", strings.Join(problems, ", "))
		return fmt.Errorf("preflight: blocked: %s", strings.Join(problems, ", "))
	}
	fmt.Fprintln(w, "preflight: ok; nothing was changed")
	return nil
}
