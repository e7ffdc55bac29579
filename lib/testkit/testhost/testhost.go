// Package testhost builds what kubeslot's tests set a host up with: a valid
// configuration, an ownership record, and a completed installation in a
// host root. Tests of lib/config, lib/ownership and lib/state cannot import
// it (it imports them); they use lib/testkit. Imported by tests only.
package testhost

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// Token is the bootstrap token of every Doc.
const Token = "abcdef.0123456789abcdef"

// Sum is a sha256 in hex (64 characters): the root filesystem's and the
// kubelet's in every Doc, and a fingerprint where any will do.
var Sum = strings.Repeat("ab", 32)

// Doc is a valid configuration document: the required settings, with the
// ones tests vary as fields. The zero Doc is valid.
type Doc struct {
	// Machine is [machine] name; "worker-1" when empty.
	Machine string
	// MachineLines are more lines of [machine] ("node_name = ...").
	MachineLines string
	// Server is [cluster] server; "https://127.0.0.1:6443" when empty.
	Server string
	// CA is [cluster] ca_pem; a new testkit.CA when empty.
	CA string
	// KubernetesLines are more lines of [kubernetes] (version is 1.37.2).
	KubernetesLines string
	// Sources is where the root filesystem (rootfs.tar.gz) and the kubelet
	// are fetched from; "http://127.0.0.1" when empty.
	Sources string
	// Tables are whole tables appended at the end.
	Tables string
}

// Text is the document; t makes the CA when d has none.
func (d Doc) Text(t testing.TB) string {
	t.Helper()
	if d.Machine == "" {
		d.Machine = "worker-1"
	}
	if d.Server == "" {
		d.Server = "https://127.0.0.1:6443"
	}
	if d.CA == "" {
		d.CA = testkit.CA(t)
	}
	if d.Sources == "" {
		d.Sources = "http://127.0.0.1"
	}
	return fmt.Sprintf(`[machine]
name = %q
%s
[cluster]
server = %q
ca_pem = %q
bootstrap_token = %q

[kubernetes]
version = "1.37.2"
%s
[rootfs]
source = "%s/rootfs.tar.gz"
sha256 = %q

[artifacts.kubelet]
url = "%s/kubelet"
sha256 = %q
%s`, d.Machine, d.MachineLines, d.Server, d.CA, Token, d.KubernetesLines, d.Sources, Sum, d.Sources, Sum, d.Tables)
}

// Config parses d.
func Config(t testing.TB, d Doc) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.toml", []byte(d.Text(t)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Example parses config.Example(), the configuration the documentation
// shows (machine worker-1).
func Example(t testing.TB) *config.Config {
	t.Helper()
	cfg, err := config.Parse("example.toml", config.Example())
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Record is a new ownership record (first checkpoint, agent version
// "test"), not saved.
func Record(t testing.TB, machine, fingerprint string) *ownership.Record {
	t.Helper()
	rec, err := ownership.New(machine, fingerprint, "test")
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// Owned saves a new ownership record (as Record) in root, laying
// kubeslot's directories down first.
func Owned(t testing.TB, root *hostroot.Root, machine, fingerprint string) *ownership.Record {
	t.Helper()
	testkit.Layout(t, root)
	rec := Record(t, machine, fingerprint)
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// Installed lays down in root what a completed bootstrap of cfg leaves:
// kubeslot's directories, the ownership record at its last checkpoint, the
// applied configuration of slot a (nspawn mode) and the active pointer on
// it; agent version v0.1.0.
func Installed(t testing.TB, root *hostroot.Root, cfg *config.Config) *ownership.Record {
	t.Helper()
	testkit.Layout(t, root)
	rec, err := ownership.New(cfg.Machine.Name, cfg.Fingerprint(), "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	rec.Checkpoint = ownership.CheckpointComplete
	if err := ownership.Save(root, rec); err != nil {
		t.Fatal(err)
	}
	store := state.NewStore(root)
	a := &state.Applied{Slot: "a", Mode: "nspawn", Fingerprint: cfg.Fingerprint(), AgentVersion: "v0.1.0", AppliedAt: time.Now(), Config: cfg}
	if err := store.SaveApplied(a); err != nil {
		t.Fatal(err)
	}
	if err := store.SetActive("a"); err != nil {
		t.Fatal(err)
	}
	return rec
}
