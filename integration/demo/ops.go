package main

// The second half of the life cycle, driven by MachineOperations as an operator drives it: an AgentUpgrade to a
// newer bundle served by the mirror, a NodeRestart, and an AgentReset that leaves the host clean.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/units"
)

// agentUpgrade builds a newer release (this source, stamped <version>-demo.2), bundles it with the real CLI, serves
// it from the mirror and asks for it with an AgentUpgrade operation; the watcher must then report the new version.
func (d *demo) agentUpgrade(ctx context.Context) (string, error) {
	if reason := d.upgraderMissing(ctx); reason != "" {
		return "", skip("upgrader not ready: %s", reason)
	}
	newVersion := d.version + "-demo.2"
	dir := filepath.Join(d.work, "release-"+newVersion)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	args := []string{"build", "-trimpath", "-ldflags", "-s -w -X github.com/kubeslot/kubeslot/lib/buildinfo.Version=" + newVersion, "-o", dir + "/"}
	for _, b := range bundle.Binaries {
		args = append(args, "./cmd/"+b)
	}
	build := exec.CommandContext(bctx, "go", args...)
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build the %s release (bounded by 10m): %w\n%s", newVersion, err, out)
	}
	file := filepath.Join(d.work, "kubeslot-"+newVersion+".tar.gz")
	create := exec.CommandContext(bctx, filepath.Join(d.flags.bins, "kubeslot"), "bundle", "create", "--bins", dir,
		"--units", filepath.Join(root, "units"), "--release-version", newVersion, "--out", file)
	if out, err := create.CombinedOutput(); err != nil {
		return "", fmt.Errorf("kubeslot bundle create: %w\n%s", err, out)
	}
	name := filepath.Base(file)
	sum, err := d.mirror.Add(name, file)
	if err != nil {
		return "", err
	}
	d.say("built and bundled %s in %s: %s sha256 %s", newVersion, secs(time.Since(t0)), d.mirror.URL(name), sum)

	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "upgrade-" + d.node},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationAgentUpgrade, MachineRef: &v1alpha1.MachineReference{Name: d.node},
			Parameters: &v1alpha1.OperationParameters{BundleURL: v1alpha1.URL(d.mirror.URL(name)), BundleSHA256: v1alpha1.SHA256(sum)}}}
	gen, err := d.createOp(ctx, op)
	if err != nil {
		return "", err
	}
	t1 := time.Now()
	if err := d.waitOp(ctx, op.Name, 5*time.Minute); err != nil {
		return "", err
	}
	took := time.Since(t1)
	err = d.waitFor(ctx, 2*time.Minute, "Machine status.agentVersion "+newVersion, func(ctx context.Context) (bool, string, error) {
		m, err := d.mc.GetMachine(ctx, d.node)
		if err != nil {
			return false, err.Error(), nil
		}
		return m.Status.AgentVersion == newVersion, "agentVersion " + m.Status.AgentVersion, nil
	})
	if err != nil {
		return "", err
	}
	detail := fmt.Sprintf("agent %s -> %s, operation created to Succeeded %s", d.version, newVersion, secs(took))
	if st := d.status(requests.NewID(requests.Upgrade, gen, op.Name)); st != nil {
		detail += ", " + phases(st)
	}
	d.version = newVersion
	return detail, nil
}

// upgraderMissing says why the agent upgrade cannot run with this build ("" when it can): the bundle command and
// the upgrader must exist. The upgrader is probed against an empty temporary root prefix, where it can change
// nothing: a stub says "not implemented".
func (d *demo) upgraderMissing(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, filepath.Join(d.flags.bins, "kubeslot"), "bundle", "create", "--help").CombinedOutput(); err != nil {
		return fmt.Sprintf("`kubeslot bundle create` is not available in this build (%v: %s)", err, firstLine(strings.TrimSpace(string(out))))
	}
	probe, err := os.MkdirTemp(d.work, "upgrader-probe-")
	if err != nil {
		return err.Error()
	}
	defer os.RemoveAll(probe)
	out, _ := exec.CommandContext(ctx, filepath.Join(d.flags.bins, "kubeslot-upgrader"), "--root-prefix", probe).CombinedOutput()
	if strings.Contains(string(out), "not implemented") {
		return "kubeslot-upgrader says: " + firstLine(strings.TrimSpace(string(out)))
	}
	return ""
}

// nodeRestart restarts the node in place through a NodeRestart operation.
func (d *demo) nodeRestart(ctx context.Context) (string, error) {
	slot := d.activeSlot()
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "restart-" + d.node},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationNodeRestart, MachineRef: &v1alpha1.MachineReference{Name: d.node}}}
	d.restartAt = time.Now()
	gen, err := d.createOp(ctx, op)
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	if err := d.waitOp(ctx, op.Name, 5*time.Minute); err != nil {
		return "", err
	}
	if err := d.nodeReady(ctx, t0, 3*time.Minute); err != nil {
		return "", err
	}
	if s := d.activeSlot(); s != slot {
		return "", fmt.Errorf("a restart in place moved the node from slot %s to %q", slot, s)
	}
	detail := "restarted in place on slot " + slot
	if st := d.status(requests.NewID(requests.Restart, gen, op.Name)); st != nil {
		detail += ", " + phases(st)
	}
	return detail, nil
}

// workloadAfterRepave and workloadAfterRestart show the workload back after the repave (a new node: new containers)
// and the restart (the same machine: the containers normally kept), with the downtime the probe from the host saw.
func (d *demo) workloadAfterRepave(ctx context.Context) (string, error) {
	return d.workloadBack(ctx, d.changedAt, "repave", false)
}

func (d *demo) workloadAfterRestart(ctx context.Context) (string, error) {
	return d.workloadBack(ctx, d.restartAt, "restart", true)
}

// agentReset removes kubeslot from the host through an AgentReset operation.
func (d *demo) agentReset(ctx context.Context) (string, error) {
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: "reset-" + d.node},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationAgentReset, MachineRef: &v1alpha1.MachineReference{Name: d.node}}}
	if _, err := d.createOp(ctx, op); err != nil {
		return "", err
	}
	t0 := time.Now()
	if err := d.waitOp(ctx, op.Name, 5*time.Minute); err != nil {
		return "", err
	}
	// kubeslot-reset.service hands the request over to kubeslot-resetting.service, which removes itself last.
	unitFile := "/etc/systemd/system/" + units.Resetting
	err := d.waitFor(ctx, 3*time.Minute, base+" removed and "+units.Resetting+" finished and gone", func(ctx context.Context) (bool, string, error) {
		out, _ := d.inHost(ctx, "systemctl", "is-active", units.Resetting)
		s := strings.TrimSpace(out)
		gone, unitGone := !d.hostExists(ctx, base), !d.hostExists(ctx, unitFile)
		return gone && unitGone && s != "active" && s != "activating" && s != "deactivating",
			fmt.Sprintf("%s present %v, %s present %v, resetting unit %s", base, !gone, unitFile, !unitGone, s), nil
	})
	if err != nil {
		return "", err
	}
	return "operation Succeeded, host root removed, " + secs(time.Since(t0)) + " from operation to clean", nil
}

// hostClean checks the host holds nothing of kubeslot: no host root, no unit files or enable links, no active
// kubeslot or node units, no machines, no slot trees. What stays is the operator's configuration and the demo's
// own sandbox drop-ins (not kubeslot's: the demo wrote them).
func (d *demo) hostClean(ctx context.Context) (string, error) {
	var problems []string
	for _, p := range []string{base, "/var/lib/machines/a", "/var/lib/machines/b", "/etc/systemd/nspawn/a.nspawn", "/etc/systemd/nspawn/b.nspawn"} {
		if d.hostExists(ctx, p) {
			problems = append(problems, p+" still exists")
		}
	}
	out, err := d.inHost(ctx, "sh", "-c", "find /etc/systemd/system -name 'kubeslot-*' -o -name 'systemd-nspawn@*' | grep -v -e '\\.d$' -e '\\.d/demo-sandbox\\.conf$'; true")
	if err != nil {
		return "", err
	}
	if s := strings.TrimSpace(out); s != "" {
		problems = append(problems, "unit files or links left:\n"+s)
	}
	out, _ = d.inHost(ctx, "systemctl", "list-units", "--all", "--plain", "--no-legend", "kubeslot-*", "systemd-nspawn@*")
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[2] != "inactive" {
			problems = append(problems, "unit still "+f[2]+": "+l)
		}
	}
	if out, err := d.inHost(ctx, "machinectl", "list", "--no-legend"); err != nil || strings.TrimSpace(out) != "" {
		problems = append(problems, fmt.Sprintf("machines still registered: %v %s", err, strings.TrimSpace(out)))
	}
	if d.pods {
		// the bridge pod network in the host's network namespace: the link and the CNI plugins' firewall chains
		out, _ := d.inHost(ctx, "sh", "-c", "ip -o link show cni0 2>/dev/null; iptables -w 5 -t nat -S 2>/dev/null | grep -e '-j CNI-' -e '-N CNI-'; true")
		if s := strings.TrimSpace(out); s != "" {
			problems = append(problems, "pod network left in the host's network namespace:\n"+s)
		}
	}
	if len(problems) > 0 {
		return "", fmt.Errorf("the host is not clean after the reset:\n%s", strings.Join(problems, "\n"))
	}
	cfg, err := d.host.ReadFile(units.ConfigPath)
	if err != nil {
		return "", fmt.Errorf("the operator's %s was removed by the reset: %w", units.ConfigPath, err)
	}
	if has, err := config.HasJoinToken(cfg); err != nil || has {
		return "", fmt.Errorf("%s after the reset: still holds the join token %v, err %v", units.ConfigPath, has, err)
	}
	detail := "nothing of kubeslot left"
	if d.pods {
		detail += " (nor the bridge cni0 and its CNI-* firewall chains)"
	}
	return detail + "; " + units.ConfigPath + " (the operator's input) kept without its join token", nil
}

// createOp creates an operation and returns the Machine generation the watcher will dispatch it under.
func (d *demo) createOp(ctx context.Context, op *v1alpha1.MachineOperation) (int64, error) {
	m, err := d.mc.GetMachine(ctx, d.node)
	if err != nil {
		return 0, err
	}
	if _, err := d.mc.CreateOperation(ctx, op); err != nil {
		return 0, fmt.Errorf("create MachineOperation %s (%s): %w", op.Name, op.Spec.Type, err)
	}
	d.say("created MachineOperation %s (type %s, machineRef %s)", op.Name, op.Spec.Type, d.node)
	return m.Generation, nil
}

// waitOp waits until the operation's entry for this Machine is Succeeded; Failed ends the wait at once.
func (d *demo) waitOp(ctx context.Context, name string, bound time.Duration) error {
	return d.waitFor(ctx, bound, "MachineOperation "+name+" Succeeded for Machine "+d.node, func(ctx context.Context) (bool, string, error) {
		op, err := d.mc.GetOperation(ctx, name)
		if err != nil {
			return false, err.Error(), nil
		}
		e := op.Status.Target(d.node, d.node)
		if e == nil {
			return false, "no status entry for the Machine yet", nil
		}
		if e.Phase == v1alpha1.OperationFailed {
			return false, "", fmt.Errorf("operation %s Failed: %s", name, e.Message)
		}
		return e.Phase == v1alpha1.OperationSucceeded, string(e.Phase) + ": " + e.Message, nil
	})
}

// status reads a worker's status file from the host (nil when absent or unreadable).
func (d *demo) status(id string) *requests.Status {
	data, err := d.host.ReadFile(base + "/status/" + id + ".json")
	if err != nil {
		return nil
	}
	var s requests.Status
	if json.Unmarshal(data, &s) != nil {
		return nil
	}
	return &s
}

// phases summarizes a status: its phases with durations and the node downtime it measured.
func phases(s *requests.Status) string {
	var parts []string
	for _, p := range s.Phases {
		parts = append(parts, fmt.Sprintf("%s %s", p.Name, secs(p.Duration)))
	}
	out := "phases: " + strings.Join(parts, ", ")
	if s.Downtime > 0 {
		out += "; node downtime " + secs(s.Downtime)
	}
	return out
}
