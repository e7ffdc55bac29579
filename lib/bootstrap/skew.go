package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
)

// versionTimeout bounds the API server version lookup of a bootstrap run
// and of its preflight.
const versionTimeout = 15 * time.Second

// ServerVersion asks the API server for its version (/version), with the
// node's identity once it has one, else with the join credentials: every
// client may read it (system:public-info-viewer).
func (c *NodeCluster) ServerVersion(ctx context.Context, cfg *config.Config) (string, error) {
	rc, err := c.RESTConfig(cfg)
	if errors.Is(err, nodeidentity.ErrNoIdentity) {
		var creds *nodeconfig.Credentials
		if creds, err = nodeconfig.LoadCredentials(c.Root, cfg); err == nil {
			rc, err = clientcmd.RESTConfigFromKubeConfig(creds.BootstrapKubeconfig)
		}
	}
	if err != nil {
		return "", err
	}
	rc = rest.CopyConfig(rc)
	rc.Timeout = versionTimeout
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return "", err
	}
	ch := make(chan error, 1)
	var v string
	go func() {
		info, err := cs.Discovery().ServerVersion()
		if err == nil {
			v = info.GitVersion
		}
		ch <- err
	}()
	select {
	case err := <-ch:
		return v, err
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
}

// checkSkew refuses a Kubernetes version the API server's does not allow
// (kuberelease.CheckSkew). An API server that cannot be asked is no reason
// to stop a bootstrap (it waits for the cluster later anyway): unknown is
// returned as ok=false with no error.
func checkSkew(ctx context.Context, c Cluster, cfg *config.Config) (server string, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	server, verr := c.ServerVersion(ctx, cfg)
	if verr != nil {
		return verr.Error(), false, nil
	}
	if err := kuberelease.CheckSkew(cfg.Kubernetes.Version, server); err != nil {
		return server, true, fmt.Errorf("kubernetes.version refused: %w", err)
	}
	return server, true, nil
}
