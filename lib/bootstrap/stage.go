package bootstrap

import (
	"context"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/sandbox"
	"github.com/kubeslot/kubeslot/lib/slot"
	"github.com/kubeslot/kubeslot/lib/stagekit"
)

// Command is one run of the bootstrap binary, as its flags asked.
type Command struct {
	stagekit.Host
	// ConfigFile is the configuration's path (--config).
	ConfigFile string
	// Preflight reports what a run would do and changes nothing.
	Preflight bool
}

// Run is the whole stage: the driver's prologue with the configuration
// loaded and its file protected once the layout is known, before anything
// else on the host is touched; the real collaborators; then the preflight
// report, or Run (lock, admission, phases, or the verify and repair of a
// complete host).
func (c Command) Run(ctx context.Context) error {
	var cfg *config.Config
	drv, err := stagekit.Start(ctx, c.Host, stagekit.Spec{Stage: "bootstrap", Pausable: Pausable(), Sandbox: true,
		Input: func() (err error) { cfg, err = c.config(); return err }})
	if err != nil {
		return err
	}
	defer drv.Close()
	root, log, sb := drv.Root, c.Log, drv.Sandbox
	d := Deps{
		Root:         root,
		Log:          log,
		Begin:        drv.Begin,
		Host:         HostPrep{Root: root, Log: log, PackagesOnly: sb.HostPrep == sandbox.HostPrepPackagesOnly},
		Cluster:      &NodeCluster{Root: root, Log: log},
		Releaser:     ReleaseFromExe{Root: root, Log: log},
		Pause:        drv.Pause,
		Sandbox:      sb,
		ResolveImage: slot.ResolveImage,
		Releases:     kuberelease.Pinner{Root: root},
		ConfigFile:   c.ConfigFile,
		Status:       func(s string) { _, _ = daemon.SdNotify(false, "STATUS="+s) },
	}
	if c.Preflight {
		return Preflight(ctx, d, cfg, c.Stdout)
	}
	d.Systemd = drv.Systemd()
	d.NewIsolation = Isolation(root, d.Systemd, sandbox.BackendSettings(sb), log)
	res, err := Run(ctx, d, cfg)
	if err != nil {
		return err
	}
	log.Info("bootstrap run finished", "decision", res.Decision, "install_id", res.InstallID,
		"phases", res.Phases, "repaired", res.Repaired, "took", time.Since(c.Started).Round(time.Millisecond))
	return nil
}

// config loads the configuration and protects its file: its join token
// readable by others is fixed (logged), or only warned about by a
// preflight.
func (c Command) config() (*config.Config, error) {
	cfg, err := config.LoadForStage(c.ConfigFile)
	if err != nil {
		return nil, err
	}
	return cfg, ProtectConfig(c.ConfigFile, cfg, !c.Preflight, c.Log)
}
