package config

import (
	"fmt"

	"github.com/kubeslot/kubeslot/lib/releasekey"
)

// Upgrade is what this host's upgrader accepts. Like Metrics it is the
// agent's setting, not the node's (kept out of the applied copy and the
// Fingerprint), and the upgrader reads it from the operator's file at each
// run: the keys are the host's own word, which nobody who can only create
// MachineOperations can change.
type Upgrade struct {
	// TrustedKeys are minisign public keys (the RW… line of a .pub file).
	// With any, an AgentUpgrade's bundle must come with a signature by one
	// of them (<bundle URL>.minisig), checked before anything of it is
	// unpacked; without, a bundle is trusted by the sha256 the operation
	// names.
	TrustedKeys []string `toml:"trusted_keys" json:"-"`
}

// upgrade checks [upgrade]: every key a minisign public key.
func (v *validator) upgrade(u *Upgrade) {
	for i, k := range u.TrustedKeys {
		if _, err := releasekey.Parse(k); err != nil {
			v.fail([]string{"upgrade", "trusted_keys"}, fmt.Sprintf("[%d] %s", i, quote(k)), "%v", err)
		}
	}
}
