// Package releasekey reads the keys a host trusts to sign kubeslot release
// bundles (minisign public keys, `[upgrade] trusted_keys`). A leaf package,
// so that lib/config can check the setting and lib/bundle can verify with
// it without importing each other. Imported by lib/config and lib/bundle.
package releasekey

import (
	"fmt"
	"strings"

	"aead.dev/minisign"
)

// Parse reads a trusted key: a minisign public key, its base64 line
// ("RW…") or the whole .pub file's two lines.
func Parse(s string) (minisign.PublicKey, error) {
	var k minisign.PublicKey
	line := strings.TrimSpace(s)
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = strings.TrimSpace(line[i+1:]) // after the untrusted comment
	}
	if err := k.UnmarshalText([]byte(line)); err != nil {
		return k, fmt.Errorf("not a minisign public key (the RW… line of minisign.pub): %w", err)
	}
	return k, nil
}
