package main

import (
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/cli"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
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
	c.joinCredential(e, cfg)
	return nil
}

// joinCredential says what the configuration's join credential amounts to
// on this host (--root-prefix): a token beside a node identity is a
// standing credential nobody needs, and no credential without an identity
// cannot join. A host root that cannot be opened (the file checked on
// another machine) gets the general advice only.
func (c configCheckCmd) joinCredential(e *env, cfg *config.Config) {
	var identity bool
	root, err := e.globals.Root()
	if err == nil {
		identity, err = nodeidentity.Usable(root, time.Now())
	}
	hasToken := cfg.Cluster.BootstrapToken != ""
	switch {
	case err == nil && identity && hasToken:
		fmt.Fprintf(e.io.Stderr, "warning: cluster.bootstrap_token: this host's node identity exists (%s), so the join token is "+
			"a long-lived credential it does not need: remove it (the next bootstrap run does), and revoke it in the cluster "+
			"(kubeadm token delete <id>) unless other hosts still join with it\n", root.HostPath(hostroot.IdentityDir))
	case err == nil && !identity && !hasToken && cfg.Cluster.Kubeconfig == "":
		fmt.Fprintf(e.io.Stderr, "warning: cluster.bootstrap_token: not set, and this host has no usable node identity (%s): a bootstrap "+
			"cannot join; set a fresh, short-lived token (kubeadm token create --ttl 1h) under [cluster]\n", root.HostPath(hostroot.IdentityDir))
	case hasToken:
		fmt.Fprintln(e.io.Stdout, "  join token: make it short-lived (kubeadm token create --ttl 1h); the bootstrap removes it "+
			"from this file once the node has joined")
	}
}
