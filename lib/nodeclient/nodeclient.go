// Package nodeclient is the node's own client of the cluster: client-go's
// typed clientset over the kubelet's client identity (system:node:<name>,
// lib/nodeidentity), for what a stage asks about its own Node once it has
// started it: wait until the Node is Ready as posted by the kubelet that
// runs now, patch the Node's labels, read its kubelet version, and read the
// API server's version (with the join credentials while the node has no
// identity yet).
//
// Imported by the stages that start a node and check it: lib/bootstrap and
// lib/repave (which builds the repaver's client), and lib/slot (the
// version lookup's bound).
// Never by the watcher: it links the typed clientset, which the watcher must
// stay without.
package nodeclient

import (
	"log/slog"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
)

// Client reaches the cluster as the node of a configuration (each method
// takes it): the configuration's server and CA, the kubelet's current
// client pair in the identity directory.
type Client struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// Identity is the host path of the node identity directory; "" means
	// <base>/identity.
	Identity string
	// Stage names the requests: their user agent is "<Stage>/<version>".
	Stage string
}

// RESTConfig is a client configuration for the node identity: the
// configuration's server and CA, and the kubelet's current client
// certificate (lib/nodeidentity). nodeidentity.ErrNoIdentity (wrapped) when
// there is none yet.
func (c *Client) RESTConfig(cfg *config.Config) (*rest.Config, error) {
	rc, err := nodeidentity.RESTConfig(c.Root, c.Identity, cfg)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = c.Stage + "/" + buildinfo.Version
	return rc, nil
}

func (c *Client) clientset(cfg *config.Config) (*kubernetes.Clientset, error) {
	rc, err := c.RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}
