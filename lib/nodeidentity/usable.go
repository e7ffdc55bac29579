package nodeidentity

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// Usable reports whether the host keeps a node identity the kubelet can
// start with at now: the current client pair in <base>/identity, its
// certificate not expired. false, nil when there is none or it expired; an
// error when it cannot be read or parsed (a corrupt pair is not taken for
// none: that would ask for a token a host might not need).
func Usable(root *hostroot.Root, now time.Time) (bool, error) {
	p, pair, err := ReadPair(root, "")
	if errors.Is(err, ErrNoIdentity) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for rest := pair; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return false, fmt.Errorf("node identity %s: no certificate in it", p)
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return false, fmt.Errorf("node identity %s: %w", p, err)
		}
		return now.Before(cert.NotAfter), nil
	}
}

// SlotCredentials are what a slot's node is configured with: with a usable
// identity (Usable), the CA and a bootstrap kubeconfig without the join
// token (nodeconfig.IdentityKubeconfig), so no slot holds the token once the
// node has joined; without one, the join credentials of the configuration
// (nodeconfig.LoadCredentials, whose error asks for a fresh token when the
// configuration has none).
func SlotCredentials(root *hostroot.Root, cfg *config.Config, now time.Time) (*nodeconfig.Credentials, error) {
	ok, err := Usable(root, now)
	if err != nil {
		return nil, err
	}
	if ok {
		return nodeconfig.IdentityKubeconfig(root, cfg)
	}
	return nodeconfig.LoadCredentials(root, cfg)
}
