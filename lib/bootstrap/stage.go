package bootstrap

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/sandbox"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
)

// Command is one run of the bootstrap binary, as its flags asked
// (cmd/kubeslot-bootstrap loads the configuration and protects its file).
type Command struct {
	Root       *hostroot.Root
	SystemdBus string // --systemd-bus; "" is the host's systemd
	Config     *config.Config
	// ConfigFile is the configuration's path (--config), for messages.
	ConfigFile string
	// Preflight reports what a run would do and changes nothing.
	Preflight bool
	// Getenv reads the sandbox settings' overrides (sandbox.Load) and the
	// test hook EnvPauseAt.
	Getenv func(string) string
	Stdout io.Writer
	Log    *slog.Logger
	// Started is when the binary started, for the "took" of the last line.
	Started time.Time
}

// Run is the whole stage: the test and sandbox settings (recorded by an
// earlier run, the environment overriding), the real collaborators, then
// the preflight report, or Run (lock, admission, phases, or the verify and
// repair of a complete host).
func (c Command) Run(ctx context.Context) error {
	root, log := c.Root, c.Log
	sb, err := sandbox.Load(root, c.Getenv)
	if err != nil {
		return exitcode.UsageError(err)
	}
	pause, err := PauseFromEnv(c.Getenv, c.Stdout)
	if err != nil {
		return exitcode.UsageError(err)
	}
	d := Deps{
		Root:         root,
		Log:          log,
		Host:         HostPrep{Root: root, Log: log, PackagesOnly: sb.HostPrep == sandbox.HostPrepPackagesOnly},
		Cluster:      &NodeCluster{Root: root, Log: log},
		Releaser:     ReleaseFromExe{Root: root, Log: log},
		Pause:        pause,
		Sandbox:      sb,
		ResolveImage: slot.ResolveImage,
		Releases:     kuberelease.Pinner{Root: root},
		ConfigFile:   c.ConfigFile,
	}
	if c.Preflight {
		return Preflight(ctx, d, c.Config, c.Stdout)
	}
	// systemd over D-Bus, connected on first use (after admission).
	sd := systemdconn.For(ctx, root.Prefix(), c.SystemdBus)
	defer sd.Close()
	d.Systemd = sd
	d.NewIsolation = Isolation(root, sd, sandbox.BackendSettings(sb), log)
	res, err := Run(ctx, d, c.Config)
	if err != nil {
		return err
	}
	log.Info("bootstrap run finished", "decision", res.Decision, "install_id", res.InstallID,
		"phases", res.Phases, "repaired", res.Repaired, "took", time.Since(c.Started).Round(time.Millisecond))
	return nil
}
