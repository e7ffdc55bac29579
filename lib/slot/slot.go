// Package slot is the life of a slot, the tasks that the bootstrap (onto
// slot a) and the repaver (onto the other slot) both run, each from its own
// phase table and durable state:
//
//   - prepare: the version skew check (Skew), the sandbox image check
//     (CheckSandboxImage), the kubelet pinned (through a Releases), then
//     the slot provisioned and configured (Prepare);
//   - start: the stage's backend starts the node;
//   - ready: the kubelet healthy and the Node Ready as posted by that
//     kubelet, within timeouts.node_ready (WaitReady), and the release the
//     slot's binary and the Node report (CheckBinary, CheckNode);
//   - commit: the slot's applied configuration, then applied/active
//     (Commit);
//   - boot: the link that starts the slot's node at host boot (BootLinks).
//
// The cluster is reached through Cluster, as the node's own identity
// (lib/nodeclient is the real one). Which task runs in which phase, and what
// a failure undoes, stays with the stage.
//
// Imported by lib/bootstrap and lib/repave only.
package slot

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/nodeclient"
	"github.com/kubeslot/kubeslot/lib/state"
)

// ClientName names the node client's requests of a slot's tasks (their
// user agent is "<ClientName>/<version>"): the bootstrap's name, which the
// repaver's Node requests have always carried too.
const ClientName = "kubeslot-bootstrap"

// Cluster is what a slot's tasks ask of the control plane, as the node.
type Cluster interface {
	// ServerVersion is the API server's version (/version's gitVersion).
	ServerVersion(ctx context.Context, cfg *config.Config) (string, error)
	// WaitReady waits until cfg's Node is Ready as posted by a kubelet
	// started at since or later, bounded by ctx.
	WaitReady(ctx context.Context, cfg *config.Config, since time.Time) error
	// KubeletVersion is the kubelet version cfg's Node reports
	// (status.nodeInfo.kubeletVersion, e.g. "v1.37.2").
	KubeletVersion(ctx context.Context, cfg *config.Config) (string, error)
}

// Releases finds what a Kubernetes version installs.
type Releases interface {
	// Pin records in cfg the kubelet of its version on its release mirror
	// (kuberelease.Pinner); a no-op for an explicit kubelet or one pinned.
	Pin(ctx context.Context, cfg *config.Config) error
}

// Tasks runs a slot's tasks with a stage's collaborators.
type Tasks struct {
	Log     *slog.Logger
	Cluster Cluster
	// Poll is the pause between two asks of a wait (0: 50 ms, a local
	// healthz GET inside the repave's downtime).
	Poll time.Duration
}

func (t *Tasks) poll() time.Duration {
	if t.Poll > 0 {
		return t.Poll
	}
	return 50 * time.Millisecond
}

// Skew checks cfg's Kubernetes version against the API server's under the
// upstream skew policy (kuberelease.CheckSkew). The version is asked for
// until wait has passed, every Poll; wait 0 asks once, bounded by
// nodeclient.VersionTimeout. A server that did not answer is known=false
// with the reason as server and no error: whether that stops the stage is
// its own call. A version the policy forbids is an error ("refused: …").
func (t *Tasks) Skew(ctx context.Context, cfg *config.Config, wait time.Duration) (server string, known bool, err error) {
	once := wait <= 0
	if once {
		wait = nodeclient.VersionTimeout
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		s, verr := t.Cluster.ServerVersion(wctx, cfg)
		if verr == nil {
			server = s
			break
		}
		if once {
			return verr.Error(), false, nil
		}
		select {
		case <-wctx.Done():
			return verr.Error(), false, nil
		case <-time.After(t.poll()):
		}
	}
	if err := kuberelease.CheckSkew(cfg.Kubernetes.Version, server); err != nil {
		return server, true, fmt.Errorf("refused: %w", err)
	}
	return server, true, nil
}

// Prepare provisions and configures slot from b's configuration; the
// running node, if any, is untouched. Both are idempotent.
func Prepare(ctx context.Context, b isolation.Backend, slot string) error {
	if err := b.Provision(ctx, slot); err != nil {
		return err
	}
	return b.Configure(ctx, slot)
}

// CheckBinary makes sure the kubelet binary in slot is the release cfg
// asks for: a mirror that serves another release's binary under a
// version's path, or an explicit artifacts.kubelet of another release,
// fails here, before anything is committed.
func CheckBinary(ctx context.Context, b isolation.Backend, cfg *config.Config, slot string) error {
	want := cfg.Kubernetes.Version
	bin, err := b.KubeletVersion(ctx, slot)
	if err != nil {
		return err
	}
	if !kuberelease.SameRelease(bin, want) {
		return fmt.Errorf("the kubelet binary in slot %s reports %s, but kubernetes version %s was asked for (check artifacts.kubelet or the release mirror)", slot, bin, want)
	}
	return nil
}

// CheckNode makes sure the Node reports the release cfg asks for, once its
// new kubelet has posted its status.
func (t *Tasks) CheckNode(ctx context.Context, cfg *config.Config) error {
	want := cfg.Kubernetes.Version
	node, err := t.Cluster.KubeletVersion(ctx, cfg)
	if err != nil {
		//lint:ignore ST1005 Node is the Kubernetes kind, named as kubectl names it
		return fmt.Errorf("Node %s's kubelet version: %w", cfg.Machine.NodeName, err)
	}
	if !kuberelease.SameRelease(node, want) {
		//lint:ignore ST1005 as above
		return fmt.Errorf("Node %s reports kubelet %s, but kubernetes version %s was asked for", cfg.Machine.NodeName, node, want)
	}
	t.Log.Info("kubelet version verified", "version", want, "node", node)
	return nil
}

// WaitReady waits for slot's kubelet health and the Node Ready as posted by
// that kubelet (a heartbeat since it started: never the status another
// slot's kubelet, or an earlier run of this one, left), together bounded by
// cfg's timeouts.node_ready. The two waits run side by side. Taking the
// floor from the running kubelet rather than from a time this process
// noted makes a resumed wait (after a kill or a reboot, with the kubelet
// already up) finish too. It returns when the kubelet started.
func (t *Tasks) WaitReady(ctx context.Context, b isolation.Backend, cfg *config.Config, slot string) (time.Time, error) {
	bound := cfg.Timeouts.NodeReady.Duration
	if bound <= 0 {
		bound = config.DefaultNodeReady
	}
	wctx, cancel := context.WithTimeoutCause(ctx, bound,
		fmt.Errorf("node of slot %s not Ready within %s (timeouts.node_ready)", slot, bound))
	defer cancel()
	t0 := time.Now()
	since, err := retry(wctx, t.poll(), func() (time.Time, error) { return b.KubeletStartedAt(wctx, slot) })
	if err != nil {
		return time.Time{}, fmt.Errorf("kubelet of slot %s never started: %w", slot, err)
	}
	t.Log.Info("kubelet started; waiting for its health and Node status", "slot", slot, "kubeletStarted", since.UTC().Format(time.RFC3339Nano))
	healthy := make(chan error, 1)
	go func() {
		_, err := retry(wctx, t.poll(), func() (struct{}, error) { return struct{}{}, b.KubeletHealthy(wctx, slot) })
		healthy <- err
	}()
	if err := t.Cluster.WaitReady(wctx, cfg, since); err != nil {
		cancel()
		<-healthy
		return time.Time{}, err
	}
	if err := <-healthy; err != nil {
		return time.Time{}, fmt.Errorf("kubelet of slot %s never healthy: %w", slot, err)
	}
	t.Log.Info("node Ready", "slot", slot, "waited", time.Since(t0).Round(time.Millisecond))
	return since, nil
}

// retry calls f every poll until it succeeds or ctx is done; the error
// then names ctx's cause and f's last failure.
func retry[T any](ctx context.Context, poll time.Duration, f func() (T, error)) (T, error) {
	for {
		v, err := f()
		if err == nil {
			return v, nil
		}
		select {
		case <-ctx.Done():
			var zero T
			return zero, fmt.Errorf("%w; last: %v", context.Cause(ctx), err)
		case <-time.After(poll):
		}
	}
}

// Commit makes slot the node's: its applied configuration cfg (recorded by
// agent at now), then applied/active. Only a slot whose node passed
// verification is committed; the boot link is the stage's next step.
func Commit(store *state.Store, slot string, cfg *config.Config, agent string, now time.Time) error {
	a, err := isolation.NewApplied(slot, cfg, agent, now)
	if err != nil {
		return err
	}
	if err := store.SaveApplied(a); err != nil {
		return err
	}
	return store.SetActive(slot)
}
