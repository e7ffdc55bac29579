// Command kubeslot is the CLI for people: it prints and checks
// configurations and shows what a host's installation looks like. It changes
// nothing on the host; the stage binaries do that (one exception, hidden: the
// node machine's pre-start hook, `node-hook`, which systemd runs).
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/exitcode"
)

const name = "kubeslot"

type flags struct {
	cli.Globals
	Config   configCmd   `cmd:"" help:"Print or check a bootstrap configuration."`
	Status   statusCmd   `cmd:"" help:"Show this host's installation: ownership, active slot, pending requests."`
	Verify   verifyCmd   `cmd:"" help:"Check, read only, that this host's installation is healthy (exit 0 ok, 3 problems found, 4 cannot verify)."`
	Cluster  clusterCmd  `cmd:"" help:"Install kubeslot's cluster API (CRDs, agent RBAC, admission policies) into a cluster, or remove it."`
	Rollout  rolloutCmd  `cmd:"" help:"Watch a MachineOperation: its status per machine, or an HTML report with a timeline."`
	Ignition ignitionCmd `cmd:"" help:"Print an Ignition config that makes a fresh host bootstrap itself on first boot."`
	Bundle   bundleCmd   `cmd:"" help:"Build a release bundle: the binaries, unit templates and a manifest in one tarball."`
	Version  versionCmd  `cmd:"" help:"Print this kubeslot's version (what a host's agent reports in its Machine's AGENT column), platform and Go version."`
	NodeHook nodeHookCmd `cmd:"" name:"node-hook" hidden:"" help:"Run by the node machine's unit (not by people): lifecycle hooks of a slot's node."`
}

// env is what every command's Run receives from kong.
type env struct {
	globals *cli.Globals
	io      cli.IO
	log     *slog.Logger
}

func main() { os.Exit(run(os.Args[1:], cli.StdIO())) }

func run(args []string, stdio cli.IO) int {
	var f flags
	ctx, code, done := cli.Parse(name, "kubeslot manages Kubernetes worker nodes in A/B nspawn slots.", &f, args, stdio)
	if done {
		return code
	}
	log, err := f.Logger(stdio.Stderr, name)
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "%s: %v\n", name, err)
		return exitcode.Usage
	}
	// Errors for the person at the terminal: one plain line, not a log record.
	return cli.ExitPlain(stdio.Stderr, name, ctx.Run(&env{globals: &f.Globals, io: stdio, log: log}))
}
