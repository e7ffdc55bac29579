// Package verifytest builds, in a temporary host root, what a healthy
// installation holds for `kubeslot verify` (lib/verify): the completed
// bootstrap's record and applied configuration, two releases with
// manifests, the current and last-good links, the unit files as the
// current release renders them with their enablement links, the slot's boot
// link, a node identity and the configuration file; and a fake systemd that says all of it runs.
// Imported by tests only (lib/verify, lib/bootstrap, cmd/kubeslot).
package verifytest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
	"github.com/kubeslot/kubeslot/lib/unitinstall"
	"github.com/kubeslot/kubeslot/units"
)

// Healthy lays a healthy installation down in a new temporary host root:
// current on green, last-good on blue, slot a active, a client
// certificate valid until certNotAfter.
func Healthy(t testing.TB, certNotAfter time.Time) *hostroot.Root {
	t.Helper()
	root := testkit.Root(t)
	rec := testhost.Installed(t, root, testhost.Example(t))
	for _, name := range release.Names {
		Release(t, root, name, true)
	}
	must(t, release.SetCurrent(root, "green"))
	must(t, release.SetLastGood(root, "blue"))
	rendered, err := units.RenderFrom(units.Templates(), units.Vars{Base: root.Base()})
	must(t, err)
	_, err = unitinstall.Install(root, rec, rendered)
	must(t, err)
	must(t, ownership.Save(root, rec))
	// The boot link of slot a's machine, as the bootstrap makes it.
	link := isolation.ModeNspawn.BootLink("a")
	local, err := unitinstall.LocalEntry(root, link.Path)
	must(t, err)
	must(t, os.MkdirAll(filepath.Dir(local), 0o755))
	must(t, os.Symlink("/usr/lib/systemd/system/"+link.Unit, local))
	Identity(t, root, time.Now().Add(-time.Hour), certNotAfter)
	ConfigFile(t, root, config.Example())
	return root
}

// ConfigFile writes data as /etc/kubeslot/config.toml (0600), the file the
// bootstrap unit runs with.
func ConfigFile(t testing.TB, root *hostroot.Root, data []byte) {
	t.Helper()
	local, err := root.Resolve("/etc/kubeslot")
	must(t, err)
	must(t, os.MkdirAll(local, 0o755))
	must(t, os.WriteFile(filepath.Join(local, "config.toml"), data, 0o600))
}

// Release writes release directory name: stand-in binaries, the unit
// templates and (withManifest) a manifest.
func Release(t testing.TB, root *hostroot.Root, name string, withManifest bool) string {
	t.Helper()
	dir, err := release.Dir(root, name)
	must(t, err)
	must(t, os.MkdirAll(filepath.Join(dir, bundle.UnitsDir), 0o755))
	for _, b := range release.Binaries {
		must(t, os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\necho "+b+"\n"), 0o755))
	}
	if !withManifest {
		must(t, os.RemoveAll(filepath.Join(dir, bundle.UnitsDir)))
		return dir
	}
	for n, data := range units.Templates() {
		must(t, os.WriteFile(filepath.Join(dir, bundle.UnitsDir, n), data, 0o644))
	}
	_, err = bundle.WriteManifest(dir, "v0.1.0", buildinfo.Arch)
	must(t, err)
	return dir
}

// Identity writes the kubelet's current client pair (certificate and key)
// into the identity directory, valid from notBefore to notAfter.
func Identity(t testing.TB, root *hostroot.Root, notBefore, notAfter time.Time) string {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "system:node:worker-1", Organization: []string{"system:nodes"}},
		NotBefore: notBefore, NotAfter: notAfter, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	must(t, err)
	key, err := x509.MarshalPKCS8PrivateKey(priv)
	must(t, err)
	data := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})...)
	p, err := root.Path(hostroot.IdentityDir, nodeidentity.CurrentPair)
	must(t, err)
	must(t, os.WriteFile(p, data, 0o600))
	return p
}

// Systemd is a fake of what verify asks systemd and machined: every unit
// enabled and active, machine a running, unless the maps say otherwise.
type Systemd struct {
	Active   map[string]string // unit -> ActiveState (default "active")
	File     map[string]string // unit -> UnitFileState (default "enabled")
	Machines map[string]string // machine -> State; a missing name has no machine (default: a running)
	Err      error             // every call fails with it (systemd unreachable)
}

// NewSystemd is a Systemd where everything runs.
func NewSystemd() *Systemd {
	return &Systemd{Active: map[string]string{}, File: map[string]string{}, Machines: map[string]string{"a": "running"}}
}

func (s *Systemd) UnitState(_ context.Context, name string) (string, string, error) {
	if s.Err != nil {
		return "", "", s.Err
	}
	if a, ok := s.Active[name]; ok {
		return a, "dead", nil
	}
	return "active", "running", nil
}

func (s *Systemd) UnitFileState(_ context.Context, name string) (string, error) {
	if s.Err != nil {
		return "", s.Err
	}
	if f, ok := s.File[name]; ok {
		return f, nil
	}
	return "enabled", nil
}

func (s *Systemd) Machine(_ context.Context, name string) (isolation.Machine, error) {
	if s.Err != nil {
		return isolation.Machine{}, s.Err
	}
	st, ok := s.Machines[name]
	if !ok {
		return isolation.Machine{}, fmt.Errorf("machine %s: %w", name, isolation.ErrNoMachine)
	}
	return isolation.Machine{Name: name, State: st, Leader: 4242, Class: "container"}, nil
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
