package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kubeslot/kubeslot/lib/cli"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
	"github.com/kubeslot/kubeslot/lib/verify"
)

type verifyCmd struct {
	Output    string `short:"o" help:"Output format: text or json." enum:"text,json" default:"text"`
	NoSystemd bool   `help:"Skip the checks that ask systemd (units' state, the node machine); they are reported skipped."`
	Config    string `help:"The configuration the bootstrap unit runs with, as a host path (under --root-prefix); empty skips the config check." default:"/etc/kubeslot/config.toml"`
}

// Run checks the installation (lib/verify) and exits 0 when all is well,
// 3 when a check found a problem, 4 when it could not be checked whole.
func (c verifyCmd) Run(e *env) error {
	root, err := e.globals.Root()
	if err != nil {
		return err
	}
	ctx := context.Background()
	d := verify.Deps{Root: root, ConfigFile: c.Config}
	if c.NoSystemd {
		d.NoSystemd = "--no-systemd"
	} else {
		sd := systemdconn.For(ctx, e.globals.RootPrefix, e.globals.SystemdBus)
		defer sd.Close()
		d.Systemd = sd
	}
	rep := verify.Run(ctx, d)
	if c.Output == "json" {
		enc := json.NewEncoder(e.io.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printVerify(e.io.Stdout, rep)
	}
	if code := rep.ExitCode(); code != 0 {
		return cli.Reported(code)
	}
	return nil
}

// printVerify writes a line per check, a line per finding under it, and
// the verdict.
func printVerify(w io.Writer, rep *verify.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range rep.Checks {
		status := string(c.Status)
		if c.Status == verify.Problem {
			status = "PROBLEM"
		}
		detail := c.Detail
		if c.Status == verify.Problem {
			detail = fmt.Sprintf("%d finding(s)", len(c.Findings))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", status, c.Name, printable(detail))
		for _, f := range c.Findings {
			fmt.Fprintf(tw, "\t\t- %s\n", printable(f.String()))
		}
	}
	tw.Flush()
	switch rep.Verdict {
	case verify.VerdictOK:
		fmt.Fprintf(w, "verify: ok (%s)\n", rep.HostRoot)
	case verify.VerdictProblems:
		fmt.Fprintf(w, "verify: problems found (%s)\n", rep.HostRoot)
	default:
		fmt.Fprintf(w, "verify: cannot verify (%s): %s\n", rep.HostRoot, printable(strings.Join(rep.CannotVerify, "; ")))
	}
}
