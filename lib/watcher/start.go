package watcher

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/metrics"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/sandbox"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Stage is the watcher's binary: the lock holder's name, and what its unit
// runs from <base>/current.
const Stage = "kubeslot-watcher"

// Command is one run of the watcher binary, as its flags asked.
type Command struct {
	stagekit.Host
	// Kubeconfig names the node identity; "" is <base>/identity/kubeconfig,
	// else the identity the bootstrap left.
	Kubeconfig string
	// LockWait is one round of waiting for the installation lock.
	LockWait time.Duration
	// ReadyAfter: READY even when the cluster was never reached.
	ReadyAfter time.Duration
	// UpgradeProbation is Options.UpgradeProbation.
	UpgradeProbation time.Duration
	// RolloutLease and RolloutPoll are Options' (0: lib/rollout's defaults).
	RolloutLease, RolloutPoll time.Duration
	// Config is the host path of the operator's configuration file, read
	// at start for its [metrics] table only (metrics.go); "" serves none.
	Config string
	// root is the host root and drv the stage driver (Run's).
	root *hostroot.Root
	drv  *stagekit.Driver
	// metrics is set by Run when the endpoint is on.
	metrics *metrics.Watcher
}

// Run is the whole stage: the flags' bounds (and, in a test build, the exit
// hook), the driver's prologue (root and layout), start-up under the
// installation lock (start), then serve until ctx ends. A deferral (69)
// tells systemd READY first: a Type=notify service that exits before
// READY=1 is a protocol failure whatever its exit status, and 69 must leave
// the unit inactive, not failed.
func (c Command) Run(ctx context.Context) error {
	if c.UpgradeProbation <= 0 {
		return exitcode.UsageError(fmt.Errorf("--upgrade-probation %s: want a positive duration", c.UpgradeProbation))
	}
	if c.RolloutLease < 3*time.Second || c.RolloutPoll <= 0 {
		return exitcode.UsageError(fmt.Errorf("--rollout-lease %s, --rollout-poll %s: want a lease of 3s or more (renewed every third of it) and a positive poll", c.RolloutLease, c.RolloutPoll))
	}
	if err := c.armExitHook(); err != nil {
		return err
	}
	drv, err := stagekit.Start(ctx, c.Host, stagekit.Spec{})
	if err != nil {
		return err
	}
	defer drv.Close()
	c.root, c.drv = drv.Root, drv
	// Before the lock: the endpoint shows a watcher waiting for it.
	m, srv := c.startMetrics()
	defer srv.Close()
	c.metrics = m
	st, err := c.start(ctx)
	if err != nil {
		if exitcode.Of(err) == exitcode.Deferred {
			_, _ = daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS=deferred: "+err.Error())
		}
		return err
	}
	return c.serve(ctx, st)
}

// started is what the locked start-up phase found.
type started struct {
	root        *hostroot.Root
	machineName string
	nodeName    string
	kubeconfig  string // local path
	// hooksErr is why the active slot's lifecycle hooks could not be
	// ensured; nil when they were (or there was no trusted slot to ask).
	hooksErr error
	// identity is set when no kubeconfig file names the identity: the
	// client is then built from the applied configuration's server and CA
	// and the kubelet's current client pair in <base>/identity, which is
	// what a bootstrapped host has.
	identity func() (*rest.Config, error)
}

// rest builds the cluster client configuration, again after each rotation.
func (st *started) rest() (*rest.Config, error) {
	if st.identity != nil {
		cfg, err := st.identity()
		if err != nil {
			return nil, err
		}
		return TuneREST(cfg), nil
	}
	return loadREST(st.kubeconfig)
}

// begin runs the stage prologue (lib/ownership), however long another
// stage holds the lock (a long repave resumed after a reboot): the watcher
// is the host's only ear for its Machine, and a watcher that deferred (exit
// 69, never restarted) would leave the host deaf until the next boot. Every round of wait it tells systemd it is alive and waiting
// (READY, so the start job does not time out; WATCHDOG; STATUS names the
// holder) and logs it. Only the end of ctx (SIGTERM) ends the wait.
func (c Command) begin(ctx context.Context) (*ownership.Held, error) {
	// The wait ends when admission runs: the lock is held by then.
	var round time.Time
	p := ownership.Prologue{Stage: Stage, Wait: c.LockWait, Log: c.Log, Admit: func(rec *ownership.Record, err error) (*ownership.Record, error) {
		c.metrics.AddLockWait(time.Since(round))
		c.metrics.LockWaiting(false)
		return admit(rec, err)
	}}
	c.metrics.LockWaiting(true)
	defer c.metrics.LockWaiting(false)
	for {
		round = time.Now()
		held, err := c.drv.Begin(ctx, p)
		if !errors.Is(err, ownership.ErrLockTimeout) {
			return held, err
		}
		c.metrics.AddLockWait(time.Since(round))
		if ctx.Err() != nil {
			// Stopped while waiting (SIGTERM: the upgrader restarts the
			// unit, a shutdown): a clean exit, never a failure that would
			// start the recovery unit (OnFailure=).
			return nil, exitcode.Defer(fmt.Errorf("stopped while waiting for the installation lock: %w", err))
		}
		c.Log.Warn("installation lock still busy; waiting on", "err", err.Error())
		_, _ = daemon.SdNotify(false, daemon.SdNotifyReady+"\n"+daemon.SdNotifyWatchdog+"\nSTATUS=waiting for the installation lock: "+err.Error())
	}
}

// admit is the watcher's admission (ownership.Prologue.Admit): it serves a
// complete installation, and one being reset. A host being reset keeps its
// watcher until the reset stops it: a boot in the middle of an AgentReset
// starts it again, and only it can publish the reset's result (lib/reset).
// Nothing it dispatches runs: every stage refuses a host marked resetting.
func admit(rec *ownership.Record, err error) (*ownership.Record, error) {
	switch {
	case err != nil:
		return nil, err
	case rec == nil:
		return nil, exitcode.Defer(errors.New("no installation owns this host yet: the bootstrap starts the watcher when it completes"))
	case rec.Checkpoint != ownership.CheckpointComplete && rec.Checkpoint != ownership.CheckpointResetting:
		return nil, exitcode.Defer(fmt.Errorf("installation %s is at checkpoint %q, not complete: the bootstrap starts the watcher when it completes", rec.InstallID, rec.Checkpoint))
	}
	return rec, nil
}

// start runs the phases under the installation lock and releases it.
func (c Command) start(ctx context.Context) (*started, error) {
	root, log := c.root, c.Log
	held, err := c.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer held.Release()
	rec := held.Record
	resetting := rec.Checkpoint == ownership.CheckpointResetting

	// A damaged applied configuration is not fatal here: the loop reports it
	// as Degraded and dispatches nothing, which is what an admin needs to see.
	active, err := state.NewStore(root).ActiveApplied()
	if err != nil {
		log.Error("the applied configuration cannot be trusted; reporting only", "err", err.Error())
	}
	var hooksErr error
	if resetting {
		log.Info("the installation is being reset: serving only until the reset stops the watcher", "install_id", rec.InstallID)
	}
	if active != nil && !resetting {
		settings, err := sandbox.LoadSettings(root, c.Env)
		if err != nil {
			return nil, exitcode.UsageError(err)
		}
		hooksErr = ensureHooks(ctx, root, c.SystemdBus, rec, active, settings, log)
	}

	kc := c.Kubeconfig
	if kc == "" {
		kc = root.HostPath(hostroot.IdentityDir, "kubeconfig")
	}
	local, err := root.Resolve(kc)
	if err != nil {
		return nil, err
	}
	st := &started{root: root, machineName: rec.Machine, kubeconfig: local, hooksErr: hooksErr}
	if _, err := os.Stat(local); c.Kubeconfig == "" && errors.Is(err, os.ErrNotExist) {
		// No kubeconfig file: use the node identity the bootstrap left.
		applied, err := state.NewStore(root).ActiveApplied()
		if err != nil || applied == nil {
			return nil, fmt.Errorf("no kubeconfig %s and no trusted applied configuration to build the node identity from: %v", kc, err)
		}
		st.identity = func() (*rest.Config, error) { return nodeidentity.RESTConfig(root, "", applied.Config) }
	}
	cfg, err := st.rest()
	if err != nil {
		return nil, err
	}
	if st.nodeName, err = nodeName(cfg); err != nil {
		return nil, fmt.Errorf("node identity (%s): %w", kc, err)
	}
	return st, nil
}

// hooksTimeout bounds ensuring the lifecycle hooks: connecting to systemd
// (systemdconn.DialTimeout) plus a daemon-reload.
const hooksTimeout = 60 * time.Second

// newOperator builds the node operator of the active slot's mode through the
// mode composition table; tests replace it.
var newOperator = func(ctx context.Context, root *hostroot.Root, bus string, rec *ownership.Record, a *state.Applied, settings isolation.Settings, log *slog.Logger) (isolation.Operator, func(), error) {
	mode, err := isolation.AppliedMode(a)
	if err != nil {
		return nil, nil, err
	}
	// The watcher runs in sandboxes without systemd (fleets of test hosts),
	// so it is no cli.SystemdUser, and its hooks are not refused up front:
	// with no slot provisioned they need no systemd, and a refusal would
	// report such a sandbox Degraded. Hooks that do need it fail at the
	// reload (systemdconn.For), journalled in the sandbox's root only.
	sd := systemdconn.For(ctx, root.Prefix(), bus)
	_, op, err := isolation.For(mode, isolation.Deps{Root: root, Config: a.Config, Systemd: sd, Exec: hostapi.ExecRunner{}, Node: systemdconn.DialNode,
		Log: log, Record: rec, Settings: settings})
	if err != nil {
		sd.Close()
		return nil, nil, err
	}
	return op, sd.Close, nil
}

// ensureHooks asks the active slot's node operator (the mode it was applied
// with) to ensure its lifecycle hooks, without restarting the node. The
// caller holds the installation lock: repairs are journalled in rec. A
// failure is logged and returned for the Machine's status, never fatal: the
// node keeps running on the hooks it has.
func ensureHooks(ctx context.Context, root *hostroot.Root, bus string, rec *ownership.Record, a *state.Applied, settings isolation.Settings, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, hooksTimeout)
	defer cancel()
	t0 := time.Now()
	err := func() error {
		op, closeOp, err := newOperator(ctx, root, bus, rec, a, settings, log)
		if err != nil {
			return err
		}
		defer closeOp()
		return op.EnsureHooks(ctx)
	}()
	if err != nil {
		err = fmt.Errorf("lifecycle hooks of slot %s (mode %s): %w", a.Slot, isolation.Mode(a.Mode), err)
		log.Warn("cannot ensure the active slot's lifecycle hooks; the node keeps running, reported as Degraded", "err", err.Error())
		return err
	}
	log.Info("lifecycle hooks of the active slot ensured", "slot", a.Slot, "mode", isolation.Mode(a.Mode).String(),
		"took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// loadREST reads the kubeconfig at path (a local path).
func loadREST(path string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("node identity kubeconfig %s: %w", path, err)
	}
	return TuneREST(cfg), nil
}

// nodeName reads the node from the client certificate's subject: the agent
// acts as system:node:<name>, so the identity is the authority on it.
func nodeName(cfg *rest.Config) (string, error) {
	data := cfg.CertData
	if len(data) == 0 && cfg.CertFile != "" {
		b, err := os.ReadFile(cfg.CertFile)
		if err != nil {
			return "", fmt.Errorf("client certificate: %w", err)
		}
		data = b
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return "", errors.New("no client certificate: the watcher acts as the node (system:node:<name>)")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("client certificate: %w", err)
	}
	cn := cert.Subject.CommonName
	if !strings.HasPrefix(cn, v1alpha1.NodeUserPrefix) || len(cn) == len(v1alpha1.NodeUserPrefix) {
		return "", fmt.Errorf("client certificate subject %q: want %s<node name>", cn, v1alpha1.NodeUserPrefix)
	}
	return strings.TrimPrefix(cn, v1alpha1.NodeUserPrefix), nil
}
