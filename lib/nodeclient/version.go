package nodeclient

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
)

// VersionTimeout bounds the API server version lookup (ServerVersion), and
// the stages' skew checks around it.
const VersionTimeout = 15 * time.Second

// ServerVersion asks the API server for its version (/version), with the
// node's identity once it has one, else with the join credentials: every
// client may read it (system:public-info-viewer).
func (c *Client) ServerVersion(ctx context.Context, cfg *config.Config) (string, error) {
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
	rc.Timeout = VersionTimeout
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

// KubeletVersion is the Node's status.nodeInfo.kubeletVersion.
func (c *Client) KubeletVersion(ctx context.Context, cfg *config.Config) (string, error) {
	cs, err := c.clientset(cfg)
	if err != nil {
		return "", err
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, cfg.Machine.NodeName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return n.Status.NodeInfo.KubeletVersion, nil
}
