package main

import (
	"fmt"

	"github.com/kubeslot/kubeslot/lib/cli"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

type configCmd struct {
	Example configExampleCmd `cmd:"" help:"Print a commented example configuration."`
	Check   configCheckCmd   `cmd:"" help:"Validate a configuration file; errors name the key, line and value."`
}

type configExampleCmd struct{}

func (configExampleCmd) Run(e *env) error {
	_, err := e.io.Stdout.Write(config.Example())
	return err
}

type configCheckCmd struct {
	File string `arg:"" help:"Configuration file, or - for standard input."`
}

func (c configCheckCmd) Run(e *env) error {
	var (
		cfg *config.Config
		err error
	)
	if c.File == "-" {
		data, rerr := hostroot.ReadLimited(e.io.Stdin, "standard input", config.MaxFileSize)
		if rerr != nil {
			fmt.Fprintln(e.io.Stderr, rerr)
			return cli.ErrReported
		}
		cfg, err = config.Parse("<stdin>", data)
	} else {
		cfg, err = config.Load(c.File)
	}
	if err != nil {
		// The errors are for the person who ran the command: print them
		// plainly, one per line, instead of as a log record.
		fmt.Fprintln(e.io.Stderr, err)
		return cli.ErrReported
	}
	fmt.Fprintf(e.io.Stdout, "%s: ok\n  %s\n  fingerprint %s\n", c.File, cfg.Summary(), cfg.Fingerprint())
	if w := cfg.UnpinnedKubeletWarning(); w != "" {
		fmt.Fprintf(e.io.Stderr, "warning: %s\n", w)
	}
	if c.File != "-" {
		if mode, exposed, err := config.ExposedMode(c.File, cfg); err == nil && exposed {
			fmt.Fprintf(e.io.Stderr, "warning: %s\n", config.ExposureWarning(c.File, mode))
		}
	}
	return nil
}
