package state

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

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

func (s *Store) sandboxPath() (string, error) { return s.root.File(hostroot.StateDir, SandboxFile) }

// SaveSandbox records sb (atomically, with its checksum); a zero sb removes
// the record.
func (s *Store) SaveSandbox(sb Sandbox) error {
	if sb.IsZero() {
		return s.RemoveSandbox()
	}
	p, err := s.sandboxPath()
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", p, err)
	}
	return WriteChecksummed(p, append(b, '\n'), 0o600)
}

// LoadSandbox reads the record; no record is the zero Sandbox.
func (s *Store) LoadSandbox() (Sandbox, error) {
	p, err := s.sandboxPath()
	if err != nil {
		return Sandbox{}, err
	}
	b, err := ReadChecksummed(p)
	if errors.Is(err, ErrNotFound) {
		return Sandbox{}, nil
	}
	if err != nil {
		return Sandbox{}, err
	}
	var sb Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		return Sandbox{}, &CorruptError{Path: p, Reason: "not valid JSON: " + err.Error()}
	}
	return sb, nil
}

// RemoveSandbox removes the record; absent is fine.
func (s *Store) RemoveSandbox() error {
	p, err := s.sandboxPath()
	if err != nil {
		return err
	}
	return RemoveChecksummed(p)
}
