package bootstrap

import (
	"context"
	"fmt"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/nodeclient"
)

// checkSkew refuses a Kubernetes version the API server's does not allow
// (kuberelease.CheckSkew). An API server that cannot be asked is no reason
// to stop a bootstrap (it waits for the cluster later anyway): unknown is
// returned as ok=false with no error.
func checkSkew(ctx context.Context, c Cluster, cfg *config.Config) (server string, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, nodeclient.VersionTimeout)
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
