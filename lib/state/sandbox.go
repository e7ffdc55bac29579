package state

import "github.com/kubeslot/kubeslot/lib/hostroot"

// SandboxFile is the record of the test and sandbox settings, in the state
// directory.
const SandboxFile = "sandbox.json"

// Sandbox is what a bootstrap run was told by its environment beyond the
// configuration file (lib/bootstrap: KUBESLOT_NODE_*, KUBESLOT_HOSTPREP). A
// production host has none, and no file. It is recorded because later stages
// (the repaver, a re-run of the bootstrap from the first-boot unit) start
// from units that do not carry that environment: without the record they
// would write production settings into a sandbox (the kubelet's ports, the
// host's sysctls).
type Sandbox struct {
	KubeletPort       int    `json:"kubeletPort,omitempty"`
	HealthzPort       int    `json:"healthzPort,omitempty"`
	NodeIP            string `json:"nodeIP,omitempty"`
	ReadOnlyNetSysctl bool   `json:"readOnlyNetSysctl,omitempty"`
	// HostPrep is "packages-only" or "" (everything).
	HostPrep string `json:"hostPrep,omitempty"`
	// The node's compromises on a test machine (lib/nodeconfig.Options):
	// a loopback-only pod network, containerd's native snapshotter, and a
	// restricted oom_score_adj.
	LoopbackCNI         bool   `json:"loopbackCNI,omitempty"`
	Snapshotter         string `json:"snapshotter,omitempty"`
	RestrictOOMScoreAdj bool   `json:"restrictOOMScoreAdj,omitempty"`
	// CgroupV1Writable: the host has writable cgroup v1 controllers of its
	// own (the rig's V1Controllers hosts), which the node remounts
	// read-write and may create devices under.
	CgroupV1Writable bool `json:"cgroupV1Writable,omitempty"`
	// SkipSandboxImageCheck: the bootstrap asks no registry for the sandbox
	// image (a test machine that must not reach public registries).
	SkipSandboxImageCheck bool `json:"skipSandboxImageCheck,omitempty"`
}

// IsZero reports whether s holds no setting (production).
func (s Sandbox) IsZero() bool { return s == Sandbox{} }

// sandboxFile is SandboxFile, checksummed and 0600 like the applied
// configuration.
var sandboxFile = hostroot.StateFile[Sandbox]{
	Dir: hostroot.StateDir, Name: SandboxFile, Max: MaxChecksummed, Perm: 0o600, Store: Checksummed, Advice: Advice,
}

// SaveSandbox records sb (atomically, with its checksum); a zero sb removes
// the record.
func (s *Store) SaveSandbox(sb Sandbox) error {
	if sb.IsZero() {
		return s.RemoveSandbox()
	}
	return sandboxFile.Save(s.root, &sb)
}

// LoadSandbox reads the record; no record is the zero Sandbox.
func (s *Store) LoadSandbox() (Sandbox, error) {
	sb, err := sandboxFile.Load(s.root)
	if sb == nil {
		return Sandbox{}, err
	}
	return *sb, nil
}

// RemoveSandbox removes the record; absent is fine.
func (s *Store) RemoveSandbox() error { return sandboxFile.Remove(s.root) }
