// Package testkit holds the fixtures kubeslot's tests share at the lowest
// level: a throwaway CA certificate, a host root on a temporary directory, a
// snapshot of a tree to compare host states, and the environment a stage
// binary is run with. It imports lib/hostroot only,
// so that tests of every package above it may use it (lib/testkit/testhost
// builds configurations and installations on top). Imported by tests only.
package testkit

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// CA returns a new self-signed CA certificate in PEM, valid from an hour ago
// for a day: a valid ca_pem. Each call makes another.
func CA(t testing.TB) string {
	t.Helper()
	ca, err := newCA()
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// SharedCA is one CA certificate as CA's, the same for every call in a test
// binary: configurations that differ only in what a fingerprint leaves out
// have the same fingerprint with it.
var SharedCA = sync.OnceValue(func() string {
	ca, err := newCA()
	if err != nil {
		panic(err)
	}
	return ca
})

func newCA() (string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubeslot-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}

// Root returns a host root on a new temporary directory, with no layout.
func Root(t testing.TB) *hostroot.Root {
	t.Helper()
	return RootAt(t, t.TempDir())
}

// RootAt returns the host root at prefix.
func RootAt(t testing.TB, prefix string) *hostroot.Root {
	t.Helper()
	root, err := hostroot.New(prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// LaidOut returns a host root on a new temporary directory with kubeslot's
// layout (hostroot.Root.EnsureLayout).
func LaidOut(t testing.TB) *hostroot.Root {
	t.Helper()
	root := Root(t)
	Layout(t, root)
	return root
}

// Layout lays kubeslot's directories down in root.
func Layout(t testing.TB, root *hostroot.Root) {
	t.Helper()
	if err := root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
}

// CleanEnv is this process's environment for running a stage binary:
// without kubeslot's own settings (KUBESLOT_*; a caller's
// KUBESLOT_SYSTEMD_BUS would defeat a test) and without the journal's
// (INVOCATION_ID, JOURNAL_STREAM), so that logs come back on stderr.
func CleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBESLOT_") && !strings.HasPrefix(kv, "INVOCATION_ID=") && !strings.HasPrefix(kv, "JOURNAL_STREAM=") {
			out = append(out, kv)
		}
	}
	return out
}
