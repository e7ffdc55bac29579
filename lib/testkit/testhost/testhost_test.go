package testhost

import (
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// The fixtures are what they say: a CA certificate, a valid configuration
// with the fields set, and a completed installation that loads back.
func TestFixtures(t *testing.T) {
	for name, ca := range map[string]string{"CA": testkit.CA(t), "SharedCA": testkit.SharedCA()} {
		b, _ := pem.Decode([]byte(ca))
		if b == nil {
			t.Fatalf("%s: no PEM", name)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil || !c.IsCA {
			t.Errorf("%s: %v, CA %v", name, err, c != nil && c.IsCA)
		}
	}
	if first, again := testkit.SharedCA(), testkit.SharedCA(); first != again {
		t.Error("SharedCA differs between calls")
	}
	cfg := Config(t, Doc{Machine: "m1", Server: "https://192.0.2.1:6443", Tables: "\n[timeouts]\nlock = \"1s\"\n"})
	if cfg.Machine.Name != "m1" || cfg.Cluster.Server != "https://192.0.2.1:6443" || cfg.Timeouts.Lock.Seconds() != 1 {
		t.Errorf("config: %+v", cfg)
	}
	if Config(t, Doc{}).Machine.Name != "worker-1" {
		t.Error("the zero Doc names no worker-1")
	}
	root := testkit.Root(t)
	Installed(t, root, Example(t))
	rec, err := ownership.Load(root)
	if err != nil || rec == nil || rec.Checkpoint != ownership.CheckpointComplete {
		t.Fatalf("record %+v, %v", rec, err)
	}
	if a, err := state.NewStore(root).ActiveApplied(); err != nil || a == nil || a.Slot != "a" {
		t.Errorf("active applied %+v, %v", a, err)
	}
}
