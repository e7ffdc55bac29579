package bootstrap

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/lib/sandbox"
	"github.com/kubeslot/kubeslot/lib/state"
)

// TestSandboxRecordedAndReused: a bootstrap run with sandbox settings records them; a later stage without the
// environment (the repaver, a re-run from the first-boot unit) gets them back from the record, the environment
// overriding field by field; a run without settings on a host that has none writes no record.
func TestSandboxRecordedAndReused(t *testing.T) {
	env := map[string]string{EnvKubeletPort: "20250", EnvHealthzPort: "20248", EnvNodeIP: "127.0.0.2",
		EnvReadOnlyNetSysctl: "1", EnvHostPrep: HostPrepPackagesOnly}
	f := newFakes(t)
	// Before the host root exists: the environment alone.
	sb, err := sandbox.Load(f.root, func(k string) string { return env[k] })
	want := state.Sandbox{KubeletPort: 20250, HealthzPort: 20248, NodeIP: "127.0.0.2", ReadOnlyNetSysctl: true, HostPrep: HostPrepPackagesOnly}
	if err != nil || sb != want {
		t.Fatalf("from the environment on a fresh host: %+v %v", sb, err)
	}
	d := f.deps()
	d.Sandbox = sb
	cfg := testConfig(t, "worker-1")
	if _, err := Run(t.Context(), d, cfg); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) string { return "" }
	if got, err := sandbox.Load(f.root, noEnv); err != nil || got != want {
		t.Errorf("recorded settings without the environment: %+v %v", got, err)
	}
	s, err := sandbox.LoadSettings(f.root, noEnv)
	if err != nil || s.KubeletPort != 20250 || s.HealthzPort != 20248 || s.NodeIP != "127.0.0.2" || !s.ReadOnlyNetSysctl {
		t.Errorf("backend settings of a later stage: %+v %v", s, err)
	}
	// The environment overrides the record.
	over := map[string]string{EnvKubeletPort: "30250", EnvReadOnlyNetSysctl: "0", EnvHostPrep: "full"}
	got, err := sandbox.Load(f.root, func(k string) string { return over[k] })
	if err != nil || got.KubeletPort != 30250 || got.HealthzPort != 20248 || got.ReadOnlyNetSysctl || got.HostPrep != "" {
		t.Errorf("environment over the record: %+v %v", got, err)
	}
	// A complete-host re-run without the environment keeps the record as it is.
	d = f.deps()
	d.Sandbox, _ = sandbox.Load(f.root, noEnv)
	if _, err := Run(t.Context(), d, cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := state.NewStore(f.root).LoadSandbox(); got != want {
		t.Errorf("record after a re-run without the environment: %+v", got)
	}
	// Bad values are refused.
	for k, v := range map[string]string{EnvKubeletPort: "x", EnvReadOnlyNetSysctl: "yes", EnvHostPrep: "some"} {
		if _, err := sandbox.Load(f.root, func(n string) string {
			if n == k {
				return v
			}
			return ""
		}); err == nil {
			t.Errorf("%s=%s accepted", k, v)
		}
	}

	// Production: no settings, no record.
	p := newFakes(t)
	if _, err := Run(t.Context(), p.deps(), cfg); err != nil {
		t.Fatal(err)
	}
	if path, _ := p.root.Path("state", state.SandboxFile); fileExists(path) {
		t.Errorf("a run without sandbox settings wrote %s", path)
	}
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
