package kube

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The apiserver's audit log counts, per client, what the node identities ask of the resources a kubeslot agent
// uses: the idle figures (integration/bench/bench_fleet_test.go, TestWatcherIdleOnRig) are counted at the apiserver by user and user
// agent, so the kubelet of the same node (same user, its own user agent) and every other client are told apart.
// Only node identities (group system:nodes) and only those resources are logged, at Metadata level: a full test run
// writes a few lines per node and minute. The log backend is blocking (the default): an event is in the file when
// the request is answered.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["ResponseStarted"]
rules:
- level: Metadata
  userGroups: ["system:nodes"]
  resources:
  - group: "kubeslot.dev"
  - group: ""
    resources: ["nodes", "events"]
  - group: "events.k8s.io"
- level: None
`

func (c *ControlPlane) auditPolicyPath() string { return filepath.Join(c.dir, "audit-policy.yaml") }

// AuditLog is the local path of the apiserver's audit log (JSON lines, audit.k8s.io/v1 Events).
func (c *ControlPlane) AuditLog() string { return filepath.Join(c.dir, "audit.log") }

func (c *ControlPlane) writeAuditPolicy() error {
	return os.WriteFile(c.auditPolicyPath(), []byte(auditPolicy), 0o644)
}

func (c *ControlPlane) auditArgs() []string {
	return []string{"--audit-policy-file=" + c.auditPolicyPath(), "--audit-log-path=" + c.AuditLog(),
		"--audit-log-format=json"}
}

// AuditEvent is what the idle figures read of one audit event.
type AuditEvent struct {
	AuditID    string    `json:"auditID"`
	Stage      string    `json:"stage"`
	Verb       string    `json:"verb"`
	RequestURI string    `json:"requestURI"`
	UserAgent  string    `json:"userAgent"`
	Received   time.Time `json:"requestReceivedTimestamp"`
	At         time.Time `json:"stageTimestamp"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource string `json:"resource"`
		Name     string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// Resource is the event's resource ("" when none).
func (e AuditEvent) Resource() string {
	if e.ObjectRef == nil {
		return ""
	}
	return e.ObjectRef.Resource
}

// AuditEvents reads the audit log and returns the events for which keep says so, in the log's order.
func (c *ControlPlane) AuditEvents(keep func(AuditEvent) bool) ([]AuditEvent, error) {
	f, err := os.Open(c.AuditLog())
	if err != nil {
		return nil, fmt.Errorf("kube: audit log: %w", err)
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var e AuditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("kube: audit log %s: %w", c.AuditLog(), err)
		}
		if keep(e) {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kube: audit log %s: %w", c.AuditLog(), err)
	}
	return out, nil
}
