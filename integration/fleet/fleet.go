// Package fleet runs many kubeslot watchers in one process against one control plane, each with its own node
// identity and its own host root, and measures what they cost: the apiserver's CPU time and resident memory (from
// /proc), the requests it served (its /metrics) and the requests the agents sent (counted at their client
// transport). It exists for the fleet benchmark (integration/bench/bench_fleet_test.go); only test code under
// integration/ imports it.
//
// A fleet agent is lib/watcher.Run, the loop the kubeslot-watcher binary runs, on a host root holding what a
// bootstrapped host has for it: a complete ownership record, slot a active with a committed applied configuration,
// and the node identity. The agent registers its Machine itself, as a real one does. The binary's own start-up
// (installation lock, lifecycle hooks, sd_notify) is not part of the fleet: it costs nothing while idle.
package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/watcher"
)

// Options configure Start.
type Options struct {
	// CP is the control plane with the kubeslot API installed.
	CP *kube.ControlPlane
	// N is the number of agents.
	N int
	// Dir holds one host root per agent (Dir/<name>).
	Dir string
	// Prefix names the agents: <Prefix>-<i>, a valid Machine and Node name.
	Prefix string
	// AgentVersion is what the agents report on their Machines.
	AgentVersion string
	// Log receives the fleet's progress and each agent's warnings; nil discards them.
	Log *slog.Logger
	// Starting bounds how many agents are between their start and their Machine's first status write at once
	// (default 50): a thousand TLS handshakes, first lists and registrations at the same instant only queue on the
	// apiserver's CPUs until the agents' writes time out and are retried, where a real fleet's hosts boot spread
	// out.
	Starting int
}

// Fleet is a running set of agents.
type Fleet struct {
	o      Options
	names  []string
	roots  []*hostroot.Root
	sent   atomic.Int64 // requests the agents sent, counted at their transports
	kindMu sync.Mutex
	kinds  map[string]int64 // the same by "METHOD path [(watch)]"
	synced atomic.Int64     // agents whose watches listed
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
}

// Start installs a host root for each agent and starts the agents, at most Options.Starting of them not yet
// registered at once. It returns once all are started (the last ones not yet synced: see WaitRegistered). Stop ends them, also
// after an error here.
func Start(ctx context.Context, o Options) (*Fleet, error) {
	if o.N <= 0 || o.CP == nil || o.Dir == "" || o.Prefix == "" {
		return nil, fmt.Errorf("fleet: options N=%d CP set=%v Dir=%q Prefix=%q: all are required", o.N, o.CP != nil, o.Dir, o.Prefix)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Starting <= 0 {
		o.Starting = 50
	}
	f := &Fleet{o: o, kinds: map[string]int64{}}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel
	starting := make(chan struct{}, o.Starting)
	for i := range o.N {
		name := fmt.Sprintf("%s-%d", o.Prefix, i)
		reported := &statusWritten{}
		root, cfg, err := f.install(name, reported)
		if err != nil {
			return f, err
		}
		f.names, f.roots = append(f.names, name), append(f.roots, root)
		select {
		case starting <- struct{}{}:
		case <-ctx.Done():
			return f, ctx.Err()
		}
		var once sync.Once
		done := func() { once.Do(func() { <-starting }) }
		reported.done = done
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer done() // an agent that ends before its first status write frees its place too
			err := watcher.Run(runCtx, watcher.Options{Root: root, REST: cfg, NodeName: name, MachineName: name,
				AgentVersion: o.AgentVersion, Log: o.Log.With("agent", name), Synced: func() { f.synced.Add(1) }})
			if err != nil && runCtx.Err() == nil {
				f.fail(fmt.Errorf("agent %s: watcher.Run: %w", name, err))
			}
		}()
	}
	return f, nil
}

func (f *Fleet) fail(err error) {
	f.mu.Lock()
	f.errs = append(f.errs, err)
	f.mu.Unlock()
}

// Err is what went wrong in the agents so far (nil when nothing did).
func (f *Fleet) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}

// Names are the agents' Machine (and Node) names.
func (f *Fleet) Names() []string { return append([]string(nil), f.names...) }

// Sent is the number of requests the agents have sent so far, each watch counted once when it is opened.
func (f *Fleet) Sent() int64 { return f.sent.Load() }

// SentByKind is Sent by "METHOD path", with " (watch)" for watches; compare two readings with KindsSince.
func (f *Fleet) SentByKind() map[string]int64 {
	f.kindMu.Lock()
	defer f.kindMu.Unlock()
	return maps.Clone(f.kinds)
}

// KindsSince sums the growth of each request kind since the reading before, with the agents' names replaced by
// "<agent>", as "count kind" lines, most frequent first.
func (f *Fleet) KindsSince(before map[string]int64) []string {
	agent := map[string]bool{}
	for _, n := range f.names {
		agent[n] = true
	}
	grew := map[string]int64{}
	for k, n := range f.SentByKind() {
		if d := n - before[k]; d > 0 {
			seg := strings.Split(k, "/")
			for i, s := range seg {
				if agent[s] {
					seg[i] = "<agent>"
				}
			}
			grew[strings.Join(seg, "/")] += d
		}
	}
	kinds := slices.Collect(maps.Keys(grew))
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Or(cmp.Compare(grew[b], grew[a]), cmp.Compare(a, b)) })
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = fmt.Sprintf("%d %s", grew[k], k)
	}
	return out
}

// install lays down the agent name's host root under Dir and returns it with a client configuration that counts
// the agent's requests.
func (f *Fleet) install(name string, reported *statusWritten) (*hostroot.Root, *rest.Config, error) {
	root, rc, err := Install(f.o.CP, filepath.Join(f.o.Dir, name), name, f.o.AgentVersion)
	if err != nil {
		return nil, nil, err
	}
	// Around the node identity's own wrapper (it bounds each request but watches).
	rc.WrapTransport = transport.Wrappers(rc.WrapTransport, func(rt http.RoundTripper) http.RoundTripper { return countingRT{rt, f, reported} })
	return root, rc, nil
}

// Install lays down, under the root prefix dir, the host root a bootstrapped host has for its watcher, for the node
// name: a complete ownership record, slot a active and committed (its configuration names the control plane's
// server and CA), and the node identity where the kubelet keeps it, <base>/identity/kubelet-client-current.pem
// linked to the dated pair by its path inside the node, as the kubelet's certificate manager writes it. No
// kubeconfig: the watcher builds its client from the applied configuration and that pair (lib/nodeidentity), the
// path production hosts take. It returns the root with that client configuration, tuned as the binary tunes it.
// The node is enrolled (Enroll) first, as an administrator does before a host joins; InstallUnenrolled leaves
// that out.
func Install(cp *kube.ControlPlane, prefix, name, agentVersion string) (*hostroot.Root, *rest.Config, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Enroll(ctx, cp, name); err != nil {
		return nil, nil, err
	}
	return InstallUnenrolled(cp, prefix, name, agentVersion)
}

// Enroll binds each node to kubeslot:fleet-member, as `kubeslot cluster enroll` does for a node with no Machine
// yet, and waits until the apiserver's authorizer (a cache that lags the binding) lets it register its Machine.
func Enroll(ctx context.Context, cp *kube.ControlPlane, nodes ...string) error {
	cs, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	for _, node := range nodes {
		if err := clusterinstall.BindFleetMember(ctx, cs, node, true); err != nil {
			return fmt.Errorf("fleet: enroll %s: %w", node, err)
		}
	}
	for _, node := range nodes {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   v1alpha1.AgentUsername(node),
			Groups: []string{v1alpha1.NodesGroup, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: v1alpha1.GroupName, Resource: v1alpha1.MachinesResource,
				Verb: "create"},
		}}
		for {
			got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err == nil && got.Status.Allowed {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("fleet: node %s enrolled, but not yet allowed to register its Machine (%v)", node, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// InstallUnenrolled is Install for a node no administrator enrolled.
func InstallUnenrolled(cp *kube.ControlPlane, prefix, name, agentVersion string) (*hostroot.Root, *rest.Config, error) {
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return nil, nil, fmt.Errorf("fleet: %w", err)
	}
	root, err := hostroot.New(prefix, "")
	if err != nil {
		return nil, nil, fmt.Errorf("fleet: %w", err)
	}
	if err := root.EnsureLayout(); err != nil {
		return nil, nil, fmt.Errorf("fleet: %s: %w", prefix, err)
	}
	cfg, err := config.Parse("example.toml", config.Example())
	if err != nil {
		return nil, nil, fmt.Errorf("fleet: example configuration: %w", err)
	}
	cfg.Machine.Name, cfg.Machine.NodeName = name, name
	cfg.Cluster.Server, cfg.Cluster.CAFile, cfg.Cluster.CAPEM = cp.URL(), "", string(cp.CAPEM())
	st := state.NewStore(root)
	if err := st.SaveApplied(&state.Applied{Slot: "a", Mode: "nspawn", Fingerprint: cfg.Fingerprint(),
		AgentVersion: agentVersion, AppliedAt: time.Now().UTC(), Config: cfg}); err != nil {
		return nil, nil, fmt.Errorf("fleet: %s: %w", prefix, err)
	}
	if err := st.SetActive("a"); err != nil {
		return nil, nil, fmt.Errorf("fleet: %s: %w", prefix, err)
	}
	rec, err := ownership.New(name, cfg.Fingerprint(), agentVersion)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet: %w", err)
	}
	for _, cp := range ownership.InstallCheckpoints()[1:] {
		if err := rec.SetCheckpoint(cp); err != nil {
			return nil, nil, fmt.Errorf("fleet: %s: %w", name, err)
		}
	}
	if err := ownership.Save(root, rec); err != nil {
		return nil, nil, fmt.Errorf("fleet: %s: %w", prefix, err)
	}
	cert, key, err := cp.NodeClientCert(name)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet: node certificate for %s: %w", name, err)
	}
	id, err := root.Path(hostroot.IdentityDir)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet: %w", err)
	}
	if err := os.MkdirAll(id, 0o700); err != nil {
		return nil, nil, fmt.Errorf("fleet: %w", err)
	}
	dated := "kubelet-client-" + time.Now().UTC().Format("2006-01-02-15-04-05") + ".pem"
	if err := os.WriteFile(filepath.Join(id, dated), append(append([]byte(nil), cert...), key...), 0o600); err != nil {
		return nil, nil, fmt.Errorf("fleet: %w", err)
	}
	if err := os.Symlink(path.Join(nodeconfig.CertDir, dated), filepath.Join(id, nodeidentity.CurrentPair)); err != nil {
		return nil, nil, fmt.Errorf("fleet: %w", err)
	}
	rc, err := nodeidentity.RESTConfig(root, "", cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet: node identity of %s: %w", name, err)
	}
	return root, watcher.TuneREST(rc), nil
}

// countingRT counts the requests an agent sends, in total and by kind (see Fleet.SentByKind).
type countingRT struct {
	rt       http.RoundTripper
	f        *Fleet
	reported *statusWritten
}

// statusWritten is told when its agent's first status write succeeded: its registration is over.
type statusWritten struct{ done func() }

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	c.f.sent.Add(1)
	kind := r.Method + " " + r.URL.Path
	if r.URL.Query().Get("watch") == "true" {
		kind += " (watch)"
	}
	c.f.kindMu.Lock()
	c.f.kinds[kind]++
	c.f.kindMu.Unlock()
	resp, err := c.rt.RoundTrip(r)
	if err == nil && resp.StatusCode < 300 && r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") &&
		c.reported.done != nil {
		c.reported.done()
	}
	return resp, err
}

// WrappedRoundTripper lets client-go reach the transport underneath (to cancel requests).
func (c countingRT) WrappedRoundTripper() http.RoundTripper { return c.rt }

// WaitRegistered waits until every agent's watches have listed and every agent's Machine exists with its status
// reported (agent version set), polling the Machines with admin, bounded by timeout.
func (f *Fleet) WaitRegistered(ctx context.Context, admin *machineapi.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	want := map[string]bool{}
	for _, n := range f.names {
		want[n] = true
	}
	last := "nothing listed yet"
	for {
		if err := f.Err(); err != nil {
			return err
		}
		if s := f.synced.Load(); s < int64(len(f.names)) {
			last = fmt.Sprintf("%d of %d agents synced", s, len(f.names))
		} else {
			var list v1alpha1.MachineList
			err := admin.REST().Get().Resource(v1alpha1.MachinesResource).Do(ctx).Into(&list)
			if err != nil {
				last = "list Machines: " + err.Error()
			} else {
				n := 0
				for _, m := range list.Items {
					if want[m.Name] && m.Status.AgentVersion == f.o.AgentVersion {
						n++
					}
				}
				if n == len(want) {
					return nil
				}
				last = fmt.Sprintf("%d of %d Machines registered and reported", n, len(want))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: not registered within %s: %s", timeout, last)
		case <-time.After(time.Second):
		}
	}
}

// Dispatched lists the request files the agents wrote (an idle fleet writes none): "<agent>: <kind>".
func (f *Fleet) Dispatched() ([]string, error) {
	var out []string
	for i, root := range f.roots {
		d := requests.New(root)
		for _, k := range requests.Kinds() {
			p, err := d.Pending(k)
			if err != nil {
				return out, err
			}
			if p != nil {
				out = append(out, fmt.Sprintf("%s: %s", f.names[i], k))
			}
		}
	}
	return out, nil
}

// Stop ends every agent and waits for them (bounded by timeout), then returns Err.
func (f *Fleet) Stop(timeout time.Duration) error {
	f.cancel()
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		f.fail(fmt.Errorf("fleet: agents still running %s after stop", timeout))
	}
	return f.Err()
}

// DeleteMachines deletes the agents' Machines (an absent one is fine); call after Stop, or the agents register
// them again.
func (f *Fleet) DeleteMachines(ctx context.Context, admin *machineapi.Client) error {
	var errs []error
	for _, n := range f.names {
		if err := admin.DeleteMachine(ctx, n); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete Machine %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}
