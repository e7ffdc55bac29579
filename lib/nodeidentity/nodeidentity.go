// Package nodeidentity builds a cluster client configuration for the node's
// own identity: the configuration's server and CA with the kubelet's current
// client pair, kept in <base>/identity (bind-mounted into whichever slot is
// active). Every cluster request of the agent after the kubelet's TLS
// bootstrap is made as system:node:<name>, never with the join token.
//
// It imports client-go's rest only, never the typed clientset, so the
// watcher can use it and stay small. Imported by lib/bootstrap,
// lib/nodeclient, lib/watcher, lib/verify (ReadPair: the expiry kubeslot
// verify reports) and the fleet benchmark (integration/fleet).
package nodeidentity

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// ErrNoIdentity: the kubelet has not obtained its client certificate yet.
var ErrNoIdentity = errors.New("no node identity yet")

// CurrentPair is the kubelet's link to its current client certificate and
// key (one PEM file), in the identity directory.
const CurrentPair = "kubelet-client-current.pem"

// requestTimeout bounds each request made with the configuration, except
// watches (boundRequests).
const requestTimeout = 5 * time.Second

// RESTConfig is a client configuration for the node identity in dir (a
// host path; "" means <base>/identity) for the cluster of cfg. It sets no
// user agent: the caller names itself. ErrNoIdentity (wrapped) when the
// kubelet has no client pair yet.
func RESTConfig(root *hostroot.Root, dir string, cfg *config.Config) (*rest.Config, error) {
	_, pair, err := ReadPair(root, dir)
	if err != nil {
		return nil, err
	}
	// The CA only: a node with its identity needs no join credential, and
	// the bootstrap removes the token once it has one.
	ca, err := nodeconfig.LoadCA(root, cfg)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            cfg.Cluster.Server,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: pair, KeyData: pair},
		WrapTransport:   boundRequests(requestTimeout),
	}, nil
}

// ReadPair reads the kubelet's current client pair (certificate and key,
// one PEM file) in the identity directory dir (a host path; "" means
// <base>/identity) and returns its host path too. ErrNoIdentity (wrapped)
// when there is none yet. Read only: lib/verify reports its expiry.
func ReadPair(root *hostroot.Root, dir string) (string, []byte, error) {
	if dir == "" {
		dir = root.HostPath(hostroot.IdentityDir)
	}
	p := path.Join(dir, CurrentPair)
	// The link itself is read, never followed through the host root: it
	// names a path inside the node.
	parent, err := root.Resolve(path.Dir(p))
	if err != nil {
		return p, nil, err
	}
	local := filepath.Join(parent, path.Base(p))
	// The kubelet links the current pair by its path inside the node
	// (/var/lib/kubelet/pki/...), where the identity directory is bound.
	if target, err := os.Readlink(local); err == nil {
		name := path.Base(target)
		if strings.HasPrefix(target, "/") && !strings.HasPrefix(target, nodeconfig.CertDir+"/") {
			return p, nil, fmt.Errorf("node identity %s links to %s, outside %s", p, target, nodeconfig.CertDir)
		}
		local = filepath.Join(filepath.Dir(local), name)
	}
	pair, err := hostroot.ReadRegular(local, 1<<20)
	if errors.Is(err, os.ErrNotExist) {
		return p, nil, fmt.Errorf("%s: %w", p, ErrNoIdentity)
	}
	if err != nil {
		return p, nil, fmt.Errorf("node identity: %w", err)
	}
	return p, pair, nil
}
