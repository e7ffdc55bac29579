package sandbox

import (
	"os"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestFromEnv: every variable maps to its field; bad values are refused
// and leave the record as it was.
func TestFromEnv(t *testing.T) {
	env := map[string]string{EnvKubeletPort: "20250", EnvHealthzPort: "20248", EnvNodeIP: "127.0.0.1",
		EnvReadOnlyNetSysctl: "1", EnvHostPrep: HostPrepPackagesOnly, EnvLoopbackCNI: "1", EnvSnapshotter: "native",
		EnvRestrictOOMScoreAdj: "1", EnvCgroupV1Writable: "1", EnvSkipSandboxImageCheck: "1"}
	sb, err := FromEnv(state.Sandbox{}, envOf(env))
	want := state.Sandbox{KubeletPort: 20250, HealthzPort: 20248, NodeIP: "127.0.0.1", ReadOnlyNetSysctl: true,
		HostPrep: HostPrepPackagesOnly, LoopbackCNI: true, Snapshotter: "native", RestrictOOMScoreAdj: true,
		CgroupV1Writable: true, SkipSandboxImageCheck: true}
	if err != nil || sb != want {
		t.Fatalf("from the environment: %+v %v, want %+v", sb, err, want)
	}
	s := BackendSettings(sb)
	if s.KubeletPort != 20250 || s.HealthzPort != 20248 || s.NodeIP != "127.0.0.1" || !s.ReadOnlyNetSysctl ||
		!s.LoopbackCNI || s.Snapshotter != "native" || !s.RestrictOOMScoreAdj || !s.CgroupV1Writable {
		t.Errorf("backend settings %+v", s)
	}
	for k, v := range map[string]string{EnvKubeletPort: "x", EnvHealthzPort: "70000", EnvReadOnlyNetSysctl: "yes",
		EnvHostPrep: "some", EnvLoopbackCNI: "yes", EnvSnapshotter: "zfs", EnvRestrictOOMScoreAdj: "2",
		EnvSkipSandboxImageCheck: "y"} {
		got, err := FromEnv(want, envOf(map[string]string{k: v}))
		if err == nil {
			t.Errorf("%s=%s accepted", k, v)
		}
		if got != want {
			t.Errorf("%s=%s changed the record: %+v", k, v, got)
		}
	}
}

// TestLoadRecordThenEnvironment: a later stage gets the recorded settings
// without the environment, and the environment overrides them field by
// field (0 and full turn a recorded setting off); no record is none.
func TestLoadRecordThenEnvironment(t *testing.T) {
	root := testkit.Root(t)
	noEnv := envOf(nil)
	if sb, err := Load(root, noEnv); err != nil || !sb.IsZero() {
		t.Fatalf("no record: %+v %v", sb, err)
	}
	dir, err := root.Path(hostroot.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := state.Sandbox{KubeletPort: 20250, HealthzPort: 20248, NodeIP: "127.0.0.2", ReadOnlyNetSysctl: true,
		HostPrep: HostPrepPackagesOnly}
	if err := state.NewStore(root).SaveSandbox(rec); err != nil {
		t.Fatal(err)
	}
	if got, err := Load(root, noEnv); err != nil || got != rec {
		t.Errorf("record without the environment: %+v %v", got, err)
	}
	s, err := LoadSettings(root, noEnv)
	if err != nil || s != BackendSettings(rec) {
		t.Errorf("backend settings of a later stage: %+v %v", s, err)
	}
	over := map[string]string{EnvKubeletPort: "30250", EnvReadOnlyNetSysctl: "0", EnvHostPrep: "full"}
	got, err := Load(root, envOf(over))
	if err != nil || got.KubeletPort != 30250 || got.HealthzPort != 20248 || got.ReadOnlyNetSysctl || got.HostPrep != "" {
		t.Errorf("environment over the record: %+v %v", got, err)
	}
}
