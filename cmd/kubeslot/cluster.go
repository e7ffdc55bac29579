package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeslot/kubeslot/lib/clusterinstall"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/servingcsr"
)

type clusterCmd struct {
	Install   clusterInstallCmd   `cmd:"" help:"Install or update kubeslot's CRDs, agent RBAC and admission policies (server-side apply; safe to repeat)."`
	Uninstall clusterUninstallCmd `cmd:"" help:"Remove what 'cluster install' installed."`
	// The kubelets of kubeslot nodes ask the cluster for their serving
	// certificates; Kubernetes approves none of those by itself.
	// Only a cluster admin enrolls a Machine in the fleet: nodes set no
	// labels and bind no roles.
	Enroll clusterEnrollCmd `cmd:"" help:"Enroll Machines in the fleet (label kubeslot.dev/enrolled=true, and their nodes' binding to kubeslot:fleet-member): only enrolled Machines are targets of selector operations and take rollout slots."`
	// Agents expire only the operations of their own Machine; selector
	// operations are expired here, with the cluster admin's rights.
	Expire         clusterExpireCmd         `cmd:"" help:"Delete finished MachineOperations whose spec.ttlSecondsAfterFinished has passed, judging 'finished' from the entries of their enrolled targets (agents expire only those that name their own Machine)."`
	ApproveServing clusterApproveServingCmd `cmd:"" name:"approve-serving" help:"Approve pending kubelet serving certificate requests that a node made for its own addresses (for clusters without an approver for kubernetes.io/kubelet-serving); others stay pending, with the reason."`
}

// clusterFlags are the connection flags of the cluster commands.
type clusterFlags struct {
	Kubeconfig string        `help:"Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)." placeholder:"FILE" type:"path"`
	Context    string        `help:"Kubeconfig context to use (default: its current context)." placeholder:"NAME"`
	Timeout    time.Duration `help:"Give up after this long." default:"3m"`
}

// restConfig loads the client configuration the way kubectl does: an
// explicit --kubeconfig, else the files listed in $KUBECONFIG, else
// ~/.kube/config.
func (f *clusterFlags) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: f.Context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, exitcode.UsageError(fmt.Errorf("kubeconfig: %w", err))
	}
	cfg.UserAgent = name
	return cfg, nil
}

// setup is the prologue of every cluster command: the client
// configuration and the logger.
func (f *clusterFlags) setup(e *env) (*rest.Config, *slog.Logger, error) {
	cfg, err := f.restConfig()
	if err != nil {
		return nil, nil, err
	}
	log, err := e.globals.Logger(e.io.Stderr, name)
	if err != nil {
		return nil, nil, err
	}
	return cfg, log, nil
}

func (f *clusterFlags) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), f.Timeout)
}

type clusterInstallCmd struct {
	clusterFlags
}

func (c *clusterInstallCmd) Run(e *env) error {
	cfg, log, err := c.setup(e)
	if err != nil {
		return err
	}
	ctx, cancel := c.context()
	defer cancel()
	rep, err := clusterinstall.Install(ctx, cfg, log)
	// Print what was done even when a later step failed: the person needs
	// to know what is in the cluster now.
	if perr := rep.Print(e.io.Stdout); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	if !rep.Changed() {
		fmt.Fprintln(e.io.Stdout, "Nothing changed: the cluster API was already installed.")
	}
	return nil
}

type clusterUninstallCmd struct {
	clusterFlags
	DeleteObjects bool `help:"Also delete every Machine and MachineOperation (deleting the CRDs deletes them); without it, uninstall refuses while any exist."`
}

func (c *clusterUninstallCmd) Run(e *env) error {
	cfg, log, err := c.setup(e)
	if err != nil {
		return err
	}
	ctx, cancel := c.context()
	defer cancel()
	rep, err := clusterinstall.Uninstall(ctx, cfg, log, clusterinstall.UninstallOptions{DeleteObjects: c.DeleteObjects})
	if perr := rep.Print(e.io.Stdout); perr != nil && err == nil {
		err = perr
	}
	return err
}

type clusterApproveServingCmd struct {
	clusterFlags
	Node string `help:"Only this node's requests." placeholder:"NAME"`
}

func (c *clusterApproveServingCmd) Run(e *env) error {
	cfg, log, err := c.setup(e)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := c.context()
	defer cancel()
	ds, err := servingcsr.Approve(ctx, cs, c.Node, log)
	for _, d := range ds {
		if d.Approved {
			fmt.Fprintf(e.io.Stdout, "approved  %s (node %s)\n", d.CSR, d.Node)
		} else {
			fmt.Fprintf(e.io.Stdout, "pending   %s (node %q): %s\n", d.CSR, d.Node, d.Reason)
		}
	}
	if err == nil && len(ds) == 0 {
		fmt.Fprintln(e.io.Stdout, "No pending kubelet serving requests.")
	}
	return err
}
