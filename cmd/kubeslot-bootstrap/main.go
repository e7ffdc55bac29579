// Command kubeslot-bootstrap turns this host into a Kubernetes worker node on
// slot a. It is safe to run on every boot: the ownership record decides
// whether to install, resume from a checkpoint, or (on a complete host) only
// verify and repair the units from the applied configuration. The phases
// are in lib/bootstrap (Command); this file only turns flags into its
// input.
//
// Exit codes: 0 done or nothing to do; 1 failed (invalid configuration, a
// different installation owns the host, a phase failed); 2 usage; 69 the
// installation lock stayed busy (another stage owns the host); 78 the host
// lacks what kubeslot will not install there (lib/hostprep names it, and
// how to provide it), nothing changed.
//
// Environment for tests and sandboxes only (see lib/sandbox, lib/bootstrap):
// KUBESLOT_NODE_KUBELET_PORT, KUBESLOT_NODE_HEALTHZ_PORT, KUBESLOT_NODE_IP,
// KUBESLOT_NODE_READONLY_NET_SYSCTL=1, KUBESLOT_HOSTPREP=packages-only and
// the test hook KUBESLOT_TEST_PAUSE_AT=<checkpoint>. The first five are
// recorded in <base>/state/sandbox.json; later runs and stages use the
// record, the environment overriding it (lib/sandbox.Load).
package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/alecthomas/kong"
	"github.com/kubeslot/kubeslot/lib/bootstrap"
	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

const name = "kubeslot-bootstrap"

type flags struct {
	cli.Globals
	Config    string `help:"Bootstrap configuration (TOML)." default:"/etc/kubeslot/config.toml" type:"path"`
	Preflight bool   `help:"Report what would change and what is missing; change nothing."`
}

// SystemdNeeded: every run but --preflight starts and reloads units
// (cli.SystemdUser: refused up front in a sandbox without --systemd-bus).
func (f *flags) SystemdNeeded() bool { return !f.Preflight }

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	var f flags
	return cli.Run(name, "kubeslot-bootstrap turns this host into a Kubernetes worker node on slot a.", &f, args, stdio, func(ctx context.Context, _ *kong.Context, log *slog.Logger) error {
		return stage(ctx, &f, log, stdio, os.Getenv)
	})
}

// stage loads the configuration and protects its file, before anything
// on the host is touched, and runs the stage (lib/bootstrap).
func stage(ctx context.Context, f *flags, log *slog.Logger, stdio cli.IO, getenv func(string) string) error {
	t0 := time.Now()
	cfg, err := config.LoadForStage(f.Config)
	if err != nil {
		return err
	}
	// Its join token readable by others: fixed (logged), or only warned
	// about by --preflight.
	if err := bootstrap.ProtectConfig(f.Config, cfg, !f.Preflight, log); err != nil {
		return err
	}
	root, err := f.Root()
	if err != nil {
		return exitcode.UsageError(err)
	}
	return bootstrap.Command{Root: root, SystemdBus: f.SystemdBus, Config: cfg, ConfigFile: f.Config, Preflight: f.Preflight,
		Getenv: getenv, Stdout: stdio.Stdout, Log: log, Started: t0}.Run(ctx)
}
