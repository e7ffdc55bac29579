package repave

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Stage is the holder name written into the installation lock.
const Stage = "kubeslot-repaver"

// Command is one run of the repaver binary, as its flags and environment
// asked (cmd/kubeslot-repaver parses and checks them).
type Command struct {
	Root       *hostroot.Root
	SystemdBus string // --systemd-bus; "" is the host's systemd
	Job        Job
	// LockWait bounds the wait for the installation lock (busy → 69).
	LockWait time.Duration
	// Getenv reads the sandbox settings' overrides (sandbox.Load) and the
	// test hook KUBESLOT_TEST_PAUSE_AT (PauseFromEnv).
	Getenv func(string) string
	Stdout io.Writer
	Log    *slog.Logger
	// Started is when the binary started, for the "took" of the summary.
	Started time.Time
}

// Run is the whole stage, top-down: the sandbox settings; the stage
// prologue (lock, then only a complete installation is repaved or
// restarted); the real collaborators; resume, claim, or work by hand; a
// summary line on Stdout.
func (c Command) Run(ctx context.Context) error {
	log := c.Log
	// Input, before anything on the host is touched.
	pause, err := PauseFromEnv(c.Getenv, c.Stdout)
	if err != nil {
		return exitcode.UsageError(err)
	}
	sb, err := sandbox.Load(c.Root, c.Getenv)
	if err != nil {
		return exitcode.UsageError(err)
	}
	held, err := ownership.Begin(ctx, c.Root, ownership.Prologue{Stage: Stage, Wait: c.LockWait,
		Admit: ownership.RequireComplete("the installation is not complete (bootstrap still to run)"), Log: log})
	if err != nil {
		return err
	}
	defer held.Release()
	// systemd over D-Bus on first use.
	sd := systemdconn.For(ctx, c.Root.Prefix(), c.SystemdBus)
	defer sd.Close()
	d := c.deps(sd, held.Record, sb)
	d.Pause = pause
	s, err := Execute(ctx, d, held.Lock, c.Job)
	if s != nil {
		fmt.Fprintf(c.Stdout, "%s %s: %s (active slot %s, node downtime %s, took %s)\n", s.Kind, s.RequestID, s.Phase,
			s.ActiveSlot, s.Downtime.Round(time.Millisecond), time.Since(c.Started).Round(time.Millisecond))
		if s.Message != "" {
			fmt.Fprintf(c.Stdout, "  %s\n", s.Message)
		}
	}
	return err
}

// deps are the real collaborators of a run on the installation rec.
func (c Command) deps(sd *systemdconn.Client, rec *ownership.Record, sb state.Sandbox) *Deps {
	root, log := c.Root, c.Log
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
