package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/servingcsr"
)

type clusterCmd struct {
	Install   clusterInstallCmd   `cmd:"" help:"Install or update kubeslot's CRDs, agent RBAC and admission policies (server-side apply; safe to repeat)."`
	Uninstall clusterUninstallCmd `cmd:"" help:"Remove what 'cluster install' installed."`
	Manifests clusterManifestsCmd `cmd:"" help:"Print what 'cluster install' applies (CRDs, agent RBAC, admission policies) as YAML, one document per object in apply order, for kubectl apply, Argo CD or Flux; or write it as a kustomize base with --kustomize."`
	// The kubelets of kubeslot nodes ask the cluster for their serving
	// certificates; Kubernetes approves none of those by itself.
	// Only a cluster admin enrolls a node in the fleet: nodes bind no
	// roles, and a node not enrolled writes nothing of kubeslot's.
	Enroll clusterEnrollCmd `cmd:"" help:"Enroll nodes in the fleet, before or after they join: each node's binding to kubeslot:fleet-member (without it a node only reads kubeslot's objects) and the label kubeslot.dev/enrolled=true on its Machine (only enrolled Machines are targets of selector operations and take rollout slots)."`
	// Agents expire only the operations of their own Machine; selector
	// operations are expired here, with the cluster admin's rights.
	Expire         clusterExpireCmd         `cmd:"" help:"Delete finished MachineOperations whose spec.ttlSecondsAfterFinished has passed, judging 'finished' from the entries of their enrolled targets (agents expire only those that name their own Machine)."`
	ApproveServing clusterApproveServingCmd `cmd:"" name:"approve-serving" help:"Approve pending kubelet serving certificate requests that a node made for its own addresses inside --node-cidrs, once or with --watch (for clusters without an approver for kubernetes.io/kubelet-serving); others stay pending, with the reason."`
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

type clusterManifestsCmd struct {
	Kustomize string `help:"Write a kustomize base into this directory (created if missing): kustomization.yaml and one file per object; other files there are left alone." placeholder:"DIR" type:"path"`
}

func (c *clusterManifestsCmd) Run(e *env) error {
	if c.Kustomize == "" {
		return clusterinstall.WriteYAML(e.io.Stdout)
	}
	files, err := clusterinstall.KustomizeBase()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.Kustomize, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		if err := atomicfile.WriteFile(filepath.Join(c.Kustomize, f.Name), f.Data, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.io.Stdout, "wrote %d files to %s\n", len(files), c.Kustomize)
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
	Node           string   `help:"Only this node's requests (not with --watch)." placeholder:"NAME"`
	NodeCIDRs      []string `name:"node-cidrs" sep:"," placeholder:"CIDR" help:"Ranges node IP addresses live in. Required for IP SANs: without it no IP address is ever approved (a request naming one stays pending)."`
	ServiceCIDR    []string `name:"service-cidr" sep:"," default:"10.96.0.0/12" placeholder:"CIDR" help:"The cluster's Service CIDRs; no IP inside is approved (default: ${default})."`
	DNSSuffix      []string `name:"dns-suffix" sep:"," placeholder:"DOMAIN" help:"A DNS SAN other than the node's own name must be under one of these domains. Repeatable."`
	ClusterDomain  string   `name:"cluster-domain" default:"cluster.local" placeholder:"DOMAIN" help:"The cluster's DNS domain; no name under it is approved (default: ${default})."`
	Watch          bool     `help:"Keep running: approve requests as they come (new nodes, rotations, address changes) until SIGTERM; --timeout then bounds each request."`
	PrintManifests bool     `name:"print-manifests" help:"Print the manifests that run this command with --watch in the cluster (Deployment, ServiceAccount, RBAC), with the policy flags given here, and exit."`
	Image          string   `help:"The kubeslot image the printed Deployment runs (with --print-manifests)." placeholder:"IMAGE"`
}

// policyFlags are the policy flags as --print-manifests passes them on.
func (c *clusterApproveServingCmd) policyFlags() []string {
	var out []string
	if len(c.NodeCIDRs) > 0 {
		out = append(out, "--node-cidrs="+strings.Join(c.NodeCIDRs, ","))
	}
	out = append(out, "--service-cidr="+strings.Join(c.ServiceCIDR, ","))
	for _, d := range c.DNSSuffix {
		out = append(out, "--dns-suffix="+d)
	}
	return append(out, "--cluster-domain="+c.ClusterDomain)
}

func (c *clusterApproveServingCmd) Run(e *env) error {
	policy, err := servingcsr.ParsePolicy(c.NodeCIDRs, c.ServiceCIDR, c.DNSSuffix, c.ClusterDomain)
	if err != nil {
		return exitcode.UsageError(err)
	}
	if c.PrintManifests {
		if c.Image == "" {
			return exitcode.UsageError(errors.New("--print-manifests needs --image, the kubeslot image the Deployment runs"))
		}
		if len(c.NodeCIDRs) == 0 {
			return exitcode.UsageError(errors.New("--print-manifests needs --node-cidrs: without it the approver never approves an IP address"))
		}
		b, err := servingcsr.ManifestsYAML(c.Image, c.policyFlags())
		if err != nil {
			return exitcode.UsageError(err)
		}
		_, err = e.io.Stdout.Write(b)
		return err
	}
	if c.Watch && c.Node != "" {
		return exitcode.UsageError(errors.New("--node is not used with --watch"))
	}
	cfg, log, err := c.setup(e)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	opts := servingcsr.Options{Policy: policy, APIServerHosts: serverHosts(cfg), Log: log}
	if len(policy.NodeCIDRs) == 0 {
		log.Warn("no --node-cidrs: no IP address is approved; requests that name one stay pending")
	}
	if c.Watch {
		// SIGTERM is how a Deployment's pod is stopped.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		opts.RequestTimeout = c.Timeout
		return servingcsr.Watch(ctx, cs, opts)
	}
	ctx, cancel := c.context()
	defer cancel()
	ds, err := servingcsr.Approve(ctx, cs, c.Node, opts)
	for _, d := range ds {
		if d.Approved {
			fmt.Fprintf(e.io.Stdout, "approved  %s (node %s)\n", d.CSR, d.Node)
		} else {
			fmt.Fprintf(e.io.Stdout, "pending   %s (node %q): %s\n", d.CSR, d.Node, strings.ReplaceAll(d.Reason, "\n", "; "))
		}
	}
	if err == nil && len(ds) == 0 {
		fmt.Fprintln(e.io.Stdout, "No pending kubelet serving requests.")
	}
	return err
}

// serverHosts is the host of the kubeconfig's server URL: an address of
// the apiserver no node may have in its certificate.
func serverHosts(cfg *rest.Config) []string {
	host := cfg.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	u, err := url.Parse(host)
	if err != nil || u.Hostname() == "" {
		return nil
	}
	return []string{u.Hostname()}
}
