package main

// The first half of the life cycle: the rig comes up, the host is laid down as Ignition would lay it down, the
// first-boot unit bootstraps it onto slot a on the earlier Kubernetes release, and a change of the Machine's
// Kubernetes version makes the watcher repave it onto slot b with the newer kubelet.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/mirror"
	"github.com/kubeslot/kubeslot/integration/rigenv"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/units"
)

// The label the demo adds to the Machine's node configuration: a configuration change, hence a repave.
const (
	demoReleaseDir = "release" // the Kubernetes release tree in the mirror
	demoLabel      = "kubeslot.dev/demo"
	demoLabelValue = "changed"
)

func (d *demo) startControlPlane(ctx context.Context) (string, error) {
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// Workloads: the controllers a Deployment needs without a scheduler, and node CIDRs for the bridge network;
	// ClusterEgress: the apiserver reaches the kubelet inside the host's network namespace (logs, exec).
	cp, err := kube.Start(sctx, kube.Options{BinDir: d.flags.kubeBin, Log: d.log, ControllerManager: true,
		Workloads: true, ClusterEgress: true})
	if err != nil {
		return "", fmt.Errorf("control plane (bounded by 3m): %w", err)
	}
	d.cp = cp
	if d.admin, err = kubernetes.NewForConfig(cp.AdminConfig()); err != nil {
		return "", err
	}
	if d.mc, err = machineapi.New(cp.AdminConfig()); err != nil {
		return "", err
	}
	return "apiserver " + cp.URL() + ", admin kubeconfig " + cp.AdminKubeconfig(), nil
}

// clusterInstall runs the real CLI, as an operator would against their cluster.
func (d *demo) clusterInstall(ctx context.Context) (string, error) {
	if err := d.clusterCLI(ctx, 4*time.Minute, "install", "--timeout", "3m"); err != nil {
		return "", err
	}
	d.crds = true
	return "CRDs Established, RBAC and admission policies enforced", nil
}

// enroll makes the node a member of the fleet with the real CLI, before the host joins: a node no administrator
// enrolled only reads kubeslot's objects, and its agent registers its Machine once it may.
func (d *demo) enroll(ctx context.Context) (string, error) {
	if err := d.clusterCLI(ctx, time.Minute, "enroll", d.node); err != nil {
		return "", err
	}
	return "node " + d.node + " may register its Machine (labelled kubeslot.dev/enrolled=true) and report on it", nil
}

// clusterCLI runs `kubeslot cluster <sub> --kubeconfig <admin> args...` within bound, printing the command line and
// what it printed, as an operator sees them.
func (d *demo) clusterCLI(ctx context.Context, bound time.Duration, sub string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	argv := append([]string{"cluster", sub, "--kubeconfig", d.cp.AdminKubeconfig()}, args...)
	out, err := exec.CommandContext(ctx, filepath.Join(d.flags.bins, "kubeslot"), argv...).CombinedOutput()
	d.say("$ kubeslot %s\n%s", strings.Join(argv, " "), indent(strings.TrimSpace(string(out)), "    "))
	if err != nil {
		return fmt.Errorf("kubeslot cluster %s: %w", sub, err)
	}
	return nil
}

// bootHost starts the mirror (node rootfs, kubelet) and an isolated systemd host sharing the machine's network,
// with the release and the mirror's directory bound read-only.
func (d *demo) bootHost(ctx context.Context) (string, error) {
	mirrorDir := filepath.Join(d.work, "mirror")
	var err error
	if d.mirror, err = mirror.Start(mirrorDir); err != nil {
		return "", err
	}
	if d.sums["rootfs"], err = d.mirror.Add("node-rootfs.tar.gz", d.flags.nodeRootfs); err != nil {
		return "", err
	}
	// A release tree like https://dl.k8s.io/release: the node's Kubernetes version picks its kubelet there.
	for v, dir := range map[string]string{d.kubePrev: d.flags.kubePrev, d.kubeCur: d.flags.kubeBin} {
		if _, err = d.mirror.Add(demoReleaseDir+"/"+kuberelease.KubeletPath(v, runtime.GOARCH), filepath.Join(dir, "kubelet")); err != nil {
			return "", err
		}
	}
	d.node = fmt.Sprintf("demo-%d", os.Getpid()%100000)
	d.hostName = d.node + "-h"
	o := sdhost.Options{Name: d.hostName, SharedNetwork: true, Log: d.log,
		BootTimeout: 2 * time.Minute,
		Binds: []sdhost.Bind{
			{Source: d.flags.bins, Target: hostBinsPath, ReadOnly: true},
			{Source: mirrorDir, Target: hostMirrorPath, ReadOnly: true},
		}}
	if d.pods {
		// a host whose node can run pods: its own network namespace with a node IP, writable cgroup v1
		// controllers of its own (this machine binds every controller to v1)
		o.SharedNetwork, o.NodeNetwork = false, true
		o.CgroupMode, o.V1Controllers = "hybrid", true
	}
	h, err := sdhost.Start(ctx, o)
	if err != nil {
		return "", fmt.Errorf("host %s (boot bounded by 2m): %w", d.hostName, err)
	}
	d.host = h
	if !d.pods {
		return fmt.Sprintf("host %s sharing the machine's network, PID 1 is %d on the machine; mirror %s", d.hostName, h.PID(), d.mirror.URL("")), nil
	}
	if err := d.connectHost(); err != nil {
		return "", err
	}
	return fmt.Sprintf("host %s with its own network (node IP %s), PID 1 is %d on the machine; apiserver, mirror %s and registry forwarded into it",
		d.hostName, h.NodeIP(), h.PID(), d.mirror.URL("")), nil
}

// layDown writes what `kubeslot ignition` lays down (the configuration 0600, the binaries in <base>/releases/blue,
// the relative link current, kubeslot-bootstrap.service enabled) and the sandbox drop-ins: the host shares the
// machine's kernel and network, so the node gets free kubelet ports, the loopback node IP, a read-only
// /proc/sys/net, and host preparation limited to packages (modules, sysctls and swap are the machine's).
func (d *demo) layDown(ctx context.Context) (string, error) {
	token, err := d.cp.CreateBootstrapToken(ctx, time.Hour)
	if err != nil {
		return "", err
	}
	ports, err := kube.FreePorts(2)
	if err != nil {
		return "", err
	}
	d.env = rigenv.Loopback(ports[0], ports[1])
	if d.pods {
		d.env = rigenv.Pods(d.host.NodeIP())
	}
	toml := d.config(token)
	if d.pods {
		d.say("[node] of the configuration:%s", indent(d.nodeTOML(), "    "))
	}
	if _, err := config.Parse("demo config", []byte(toml)); err != nil {
		return "", fmt.Errorf("the demo's own configuration is invalid: %w", err)
	}
	if err := d.host.WriteFile(units.ConfigPath, []byte(toml), 0o600); err != nil {
		return "", err
	}
	script := "mkdir -p " + base + "/releases/blue && cp " + hostBinsPath + "/kubeslot* " + base + "/releases/blue/ && " +
		"ln -sfn releases/blue " + base + "/current"
	if out, err := d.inHost(ctx, "sh", "-c", script); err != nil {
		return "", fmt.Errorf("lay down the release: %w\n%s", err, out)
	}
	dropIn := "[Service]\n"
	for _, e := range d.env {
		dropIn += "Environment=" + e + "\n"
	}
	for _, u := range []string{units.Bootstrap, "kubeslot-repave@.service", "kubeslot-restart.service"} {
		if err := d.host.WriteFile("/etc/systemd/system/"+u+".d/demo-sandbox.conf", []byte(dropIn), 0o644); err != nil {
			return "", err
		}
	}
	// The watcher renders the active slot's lifecycle hooks with the same settings. A runtime drop-in (the host's
	// /run): it is the sandbox's, not kubeslot's, so the reset must not find it in /etc.
	if err := d.host.WriteFile("/run/systemd/system/"+units.Watcher+".d/demo-sandbox.conf", []byte(dropIn), 0o644); err != nil {
		return "", err
	}
	unit, err := units.Render(units.Bootstrap, units.Vars{})
	if err != nil {
		return "", err
	}
	if err := d.host.InstallUnit(ctx, units.Bootstrap, unit); err != nil {
		return "", err
	}
	if out, err := d.inHost(ctx, "systemctl", "enable", units.Bootstrap); err != nil {
		return "", fmt.Errorf("enable %s: %w\n%s", units.Bootstrap, err, out)
	}
	detail := fmt.Sprintf("release %s in %s/releases/blue, config %s, %s enabled", d.version, base, units.ConfigPath, units.Bootstrap)
	if d.flags.bundle != "" {
		d.say("release bundle of make bundle: %s", d.flags.bundle)
	}
	return detail, nil
}

// config is the host's bootstrap configuration: this cluster, the mirror's node rootfs and kubelet.
func (d *demo) config(token string) string {
	return fmt.Sprintf(`# kubeslot demo host
[machine]
name = %q

[cluster]
server = %q
ca_pem = %q
bootstrap_token = %q

[kubernetes]
version = %q
cluster_dns = ["10.96.0.10"]
cluster_domain = "demo.local"

# the kubelet of the version, from a release tree laid out like https://dl.k8s.io/release,
# over https trusting the demo mirror's own CA (an http release mirror is refused)
[kubernetes.release]
mirror = %q
ca_pem = %q

[kubernetes.labels]
"node.kubernetes.io/pool" = "demo"

[rootfs]
source = %q
sha256 = %q

[timeouts]
node_ready = "3m"
stop = "30s"
`, d.node, d.cp.URL(), string(d.cp.CAPEM()), token, d.kubePrev, d.mirror.TLSURL(demoReleaseDir), d.mirror.CAPEM(), d.mirror.URL("node-rootfs.tar.gz"),
		d.sums["rootfs"]) + d.nodeTOML()
}

// bootstrap starts the first-boot unit, as the host's first boot would, and waits for the oneshot to finish.
func (d *demo) bootstrap(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	if out, err := d.host.Run(ctx, "systemctl", "start", units.Bootstrap); err != nil {
		return "", fmt.Errorf("systemctl start %s (bounded by 8m): %w\n%s", units.Bootstrap, err, out)
	}
	rec, err := d.host.ReadFile(base + "/ownership.json")
	if err != nil {
		return "", fmt.Errorf("no ownership record after the bootstrap: %w", err)
	}
	if !strings.Contains(string(rec), `"complete"`) {
		return "", fmt.Errorf("the bootstrap finished but %s/ownership.json is not at checkpoint complete", base)
	}
	return "downloaded rootfs and kubelet from the mirror, prepared slot a, node started, installation complete", nil
}

// readyOnA waits for the Node, the committed slot, the watcher and the Machine it registers.
func (d *demo) readyOnA(ctx context.Context) (string, error) {
	if err := d.nodeReady(ctx, time.Time{}, 3*time.Minute); err != nil {
		return "", err
	}
	if s := d.activeSlot(); s != "a" {
		return "", fmt.Errorf("%s/applied/active is %q, want a", base, s)
	}
	if err := d.unitActive(ctx, units.Watcher, 2*time.Minute); err != nil {
		return "", err
	}
	var m *v1alpha1.Machine
	err := d.waitFor(ctx, 2*time.Minute, "Machine "+d.node+" registered by the watcher with status.activeSlot a",
		func(ctx context.Context) (bool, string, error) {
			var err error
			if m, err = d.mc.GetMachine(ctx, d.node); err != nil {
				return false, err.Error(), nil
			}
			return m.Status.ActiveSlot == "a" && m.Status.AgentVersion != "",
				fmt.Sprintf("phase %s, slot %q, agent %q", m.Status.Phase, m.Status.ActiveSlot, m.Status.AgentVersion), nil
		})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("applied/active = a, watcher active, Machine phase %s, agent %s", m.Status.Phase, m.Status.AgentVersion), nil
}

// updateMachine edits the Machine's spec through the API with edit, as an operator would, and returns its new
// generation.
func (d *demo) updateMachine(ctx context.Context, edit func(m *v1alpha1.Machine)) (int64, error) {
	var gen int64
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := d.mc.GetMachine(ctx, d.node)
		if err != nil {
			return err
		}
		edit(m)
		m, err = d.mc.UpdateMachine(ctx, m)
		if err == nil {
			gen = m.Generation
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("update Machine %s: %w", d.node, err)
	}
	return gen, nil
}

// patchMachine asks for the next Kubernetes patch release, with updatePolicy Immediate so the watcher acts at once
// (the default, OnNodeDelete, waits until the operator drained and deleted the Node). A patch release with nothing
// else changed goes in place (spec.updateMethod Auto).
func (d *demo) patchMachine(ctx context.Context) (string, error) {
	d.patchAt = time.Now()
	gen, err := d.updateMachine(ctx, func(m *v1alpha1.Machine) {
		m.Spec.Node.KubernetesVersion = d.kubeCur
		m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
		// One node, pods bound to it by name (no scheduler): a drain would evict them with nowhere to go. The
		// repave and the later NodeRestart stop them with the node instead.
		m.Spec.Disruption = &v1alpha1.Disruption{Drain: v1alpha1.DrainNone}
	})
	if err != nil {
		return "", err
	}
	d.patchGen = gen
	return fmt.Sprintf("spec.node.kubernetesVersion %s -> %s, spec.updatePolicy=Immediate: Machine generation %d", d.kubePrev, d.kubeCur, gen), nil
}

// patched waits until the in-place patch succeeded on slot a and the Node and the Machine report the new release.
func (d *demo) patched(ctx context.Context) (string, error) {
	id := requests.NewID(requests.Restart, d.patchGen, "")
	err := d.waitFor(ctx, 5*time.Minute, "in-place patch "+id+" Succeeded on slot a", func(ctx context.Context) (bool, string, error) {
		st := d.status(id)
		if st == nil {
			return false, "no status file for " + id + " yet", nil
		}
		if st.Phase == requests.Failed {
			return false, "", fmt.Errorf("patch %s failed: %s", id, st.Message)
		}
		s := d.activeSlot()
		return s == "a" && st.Phase == requests.Succeeded, fmt.Sprintf("active %s, patch %s: %s", s, st.Phase, st.Message), nil
	})
	if err != nil {
		return "", err
	}
	if err := d.reportsVersion(ctx, d.kubeCur); err != nil {
		return "", err
	}
	detail := fmt.Sprintf("kubelet v%s -> v%s on slot a (Node and Machine), no drain", d.kubePrev, d.kubeCur)
	if st := d.status(id); st != nil {
		detail += fmt.Sprintf(", node downtime %s, %s", secs(st.Downtime), phases(st))
	}
	return detail, nil
}

// workloadAfterPatch shows the workload through the in-place patch: the container normally kept.
func (d *demo) workloadAfterPatch(ctx context.Context) (string, error) {
	return d.workloadBack(ctx, d.patchAt, "patch in place", true)
}

// changeMachine gives the node a new label through the Machine: a change of the node's configuration beyond a
// patch release, so the watcher repaves onto the other slot.
func (d *demo) changeMachine(ctx context.Context) (string, error) {
	gen, err := d.updateMachine(ctx, func(m *v1alpha1.Machine) {
		if m.Spec.Node.Labels == nil {
			m.Spec.Node.Labels = map[string]v1alpha1.LabelValue{}
		}
		m.Spec.Node.Labels[demoLabel] = demoLabelValue
	})
	if err != nil {
		return "", err
	}
	d.changedGen, d.changedAt = gen, time.Now()
	return fmt.Sprintf("spec.node.labels[%s]=%s: Machine generation %d", demoLabel, demoLabelValue, gen), nil
}

// repaved waits until the watcher's repave committed slot b, the Node is Ready again and the Machine says so.
func (d *demo) repaved(ctx context.Context) (string, error) {
	id := requests.NewID(requests.Repave, d.changedGen, "")
	err := d.waitFor(ctx, 8*time.Minute, "repave "+id+" Succeeded with "+base+"/applied/active = b", func(ctx context.Context) (bool, string, error) {
		s := d.activeSlot()
		st := d.status(id)
		if st == nil {
			return false, "active " + s + ", no status file for " + id + " yet", nil
		}
		if st.Phase == requests.Failed {
			return false, "", fmt.Errorf("repave %s failed: %s", id, st.Message)
		}
		return s == "b" && st.Phase == requests.Succeeded, fmt.Sprintf("active %s, repave %s: %s", s, st.Phase, st.Message), nil
	})
	if err != nil {
		return "", err
	}
	if err := d.nodeReady(ctx, d.changedAt, 3*time.Minute); err != nil {
		return "", err
	}
	err = d.waitFor(ctx, 2*time.Minute, "Machine phase Ready on slot b for generation "+fmt.Sprint(d.changedGen),
		func(ctx context.Context) (bool, string, error) {
			m, err := d.mc.GetMachine(ctx, d.node)
			if err != nil {
				return false, err.Error(), nil
			}
			return m.Status.ActiveSlot == "b" && m.Status.ObservedGeneration >= d.changedGen && m.Status.Phase == v1alpha1.MachineReady,
				fmt.Sprintf("phase %s, slot %q, observed generation %d", m.Status.Phase, m.Status.ActiveSlot, m.Status.ObservedGeneration), nil
		})
	if err != nil {
		return "", err
	}
	if err := d.reportsVersion(ctx, d.kubeCur); err != nil {
		return "", err
	}
	err = d.waitFor(ctx, time.Minute, "Node label "+demoLabel+"="+demoLabelValue, func(ctx context.Context) (bool, string, error) {
		n, err := d.admin.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return n.Labels[demoLabel] == demoLabelValue, fmt.Sprintf("Node label %s=%q", demoLabel, n.Labels[demoLabel]), nil
	})
	if err != nil {
		return "", err
	}
	detail := fmt.Sprintf("slot a -> b, Node label %s=%s, kubelet v%s", demoLabel, demoLabelValue, d.kubeCur)
	if st := d.status(id); st != nil {
		detail += ", " + phases(st)
	}
	return detail, nil
}

// reportsVersion waits until what runs is what the spec asked for: the Node's kubelet, and the Machine's status read
// from it.
func (d *demo) reportsVersion(ctx context.Context, v string) error {
	return d.waitFor(ctx, time.Minute, "Node and Machine report Kubernetes "+v, func(ctx context.Context) (bool, string, error) {
		n, err := d.admin.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		m, err := d.mc.GetMachine(ctx, d.node)
		if err != nil {
			return false, err.Error(), nil
		}
		applied := ""
		if m.Status.Applied != nil {
			applied = m.Status.Applied.KubernetesVersion
		}
		return n.Status.NodeInfo.KubeletVersion == "v"+v && applied == v,
			fmt.Sprintf("Node kubelet %s, Machine status.applied.kubernetesVersion %q", n.Status.NodeInfo.KubeletVersion, applied), nil
	})
}
