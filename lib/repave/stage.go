package repave

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/drain/drainkube"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/nodeclient"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/sandbox"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/stagekit"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Stage is the holder name written into the installation lock.
const Stage = "kubeslot-repaver"

// Command is one run of the repaver binary, as its flags asked.
type Command struct {
	stagekit.Host
	// Slot is the slot argument: a, b, next or "" (KUBESLOT_SLOT, else
	// next).
	Slot string
	// Restart restarts in place (--restart, or KUBESLOT_REQUEST=restart).
	Restart bool
	// ConfigFile is --config: a repave by hand of this configuration.
	ConfigFile string
	// NoDrain skips the drain of a repave or restart by hand.
	NoDrain bool
	// LockWait bounds the wait for the installation lock (busy → 69).
	LockWait time.Duration
}

// Environment set by the worker units (lib/requests).
const (
	EnvRequest = "KUBESLOT_REQUEST"
	EnvSlot    = "KUBESLOT_SLOT"
)

// Run is the whole stage, top-down: the job from the flags and the unit's
// environment; the driver's prologue (sandbox settings, the lock, then only
// a complete installation is repaved or restarted); the real collaborators;
// resume, claim, or work by hand; a summary line on Stdout.
func (c Command) Run(ctx context.Context) error {
	j, err := c.job()
	if err != nil {
		return exitcode.UsageError(err)
	}
	drv, err := stagekit.Start(ctx, c.Host, stagekit.Spec{Stage: "repave", Pausable: Pausable(), Sandbox: true})
	if err != nil {
		return err
	}
	defer drv.Close()
	held, err := drv.Begin(ctx, ownership.Prologue{Stage: Stage, Wait: c.LockWait,
		Admit: ownership.RequireComplete("the installation is not complete (bootstrap still to run)")})
	if err != nil {
		return err
	}
	d := c.deps(drv.Root, drv.Systemd(), held.Record, drv.Sandbox)
	d.Pause = drv.Pause
	s, err := Execute(ctx, d, held.Lock, j)
	if s != nil {
		fmt.Fprintf(c.Stdout, "%s %s: %s (active slot %s, node downtime %s, took %s)\n", s.Kind, s.RequestID, s.Phase,
			s.ActiveSlot, s.Downtime.Round(time.Millisecond), time.Since(c.Started).Round(time.Millisecond))
		if s.Message != "" {
			fmt.Fprintf(c.Stdout, "  %s\n", s.Message)
		}
	}
	return err
}

// job reads what to do from the flags and the unit's environment.
func (c Command) job() (Job, error) {
	j := Job{Kind: requests.Repave, Slot: c.Slot, Triggered: c.Env("TRIGGER_PATH") != "", SkipDrain: c.NoDrain}
	switch r := c.Env(EnvRequest); {
	case c.Restart || r == string(requests.Restart):
		j.Kind = requests.Restart
	case r == "" || r == string(requests.Repave):
	default:
		return j, fmt.Errorf("%s=%q: the repaver handles repave and restart", EnvRequest, r)
	}
	if j.Slot == "" {
		j.Slot = c.Env(EnvSlot)
	}
	if j.Slot == "" {
		j.Slot = NextSlot
	}
	if c.ConfigFile != "" {
		if j.Kind == requests.Restart {
			return j, errors.New("--config applies to a repave, not to --restart")
		}
		cfg, err := config.LoadForStage(c.ConfigFile)
		if err != nil {
			return j, err
		}
		j.Config = cfg
	}
	return j, nil
}

// deps are the real collaborators of a run on the installation rec.
func (c Command) deps(root *hostroot.Root, sd *systemdconn.Client, rec *ownership.Record, sb state.Sandbox) *Deps {
	log := c.Log
	settings := sandbox.BackendSettings(sb)
	return &Deps{
		Root: root, Log: log, Store: state.NewStore(root), Requests: requests.New(root),
		Isolation: func(m isolation.Mode, cfg *config.Config) (isolation.Backend, isolation.Operator, error) {
			return isolation.For(m, isolation.Deps{Root: root, Config: cfg, Systemd: sd, Exec: hostapi.ExecRunner{}, Node: systemdconn.DialNode,
				Log: log, Record: rec, Settings: settings})
		},
		Cluster:  &nodeclient.Client{Root: root, Log: log, Stage: slot.ClientName},
		Releases: kuberelease.Pinner{Root: root},
		SandboxImage: func(ctx context.Context, cfg *config.Config) error {
			line, err := slot.CheckSandboxImage(ctx, cfg, slot.ResolveImage, slot.ImageCheckSkip(sb))
			if err == nil {
				log.Info("sandbox image", "check", line)
			}
			return err
		},
		Boot: &slot.BootLinks{Root: root, Record: rec, Log: log},
		// The node's own identity: the Node authorizer and NodeRestriction
		// let it cordon only its own Node and evict only its own pods.
		Drain: func(cfg *config.Config) (drain.Cluster, error) {
			rc, err := (&nodeclient.Client{Root: root, Log: log, Stage: Stage}).RESTConfig(cfg)
			if err != nil {
				return nil, err
			}
			cs, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return nil, err
			}
			return drainkube.Kube{Client: cs}, nil
		},
		AgentVersion: buildinfo.Version,
	}
}
