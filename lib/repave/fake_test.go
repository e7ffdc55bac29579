package repave

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// host is a fake host with two slots, shared by every backend built over
// it (as the real host is shared by the old and the new configuration).
type host struct {
	mu          sync.Mutex
	provisioned map[string]bool
	running     map[string]bool   // the node serves: kubelet and containerd run
	booted      map[string]bool   // the machine runs (serving or warm)
	broken      map[string]bool   // kubelet never healthy
	fail        map[string]error  // "op:slot" → error
	calls       []string          // "op:slot"
	cfgOf       map[string]string // slot → fingerprint it was provisioned with
	moves       []string
	// nodeLabels are the Node's labels (as registered with slot a's
	// configuration, plus one the kubelet sets itself); labelErr fails
	// SetLabels.
	nodeLabels map[string]string
	labelErr   error
	// started is when each slot's kubelet last started; waitedSince the
	// floors WaitReady was given, in order.
	started     map[string]time.Time
	waitedSince []time.Time
	// serverVersion is the API server's; binary the release each slot's
	// kubelet binary reports (set at provision from the configuration,
	// unless servedVersion says what the mirror really serves).
	serverVersion string
	binary        map[string]string
	servedVersion string
	// mirror is what the mirror serves under a version, when not that
	// version's kubelet (a patch).
	mirror map[string]string
	pins   int
	// sickPolls fails that many more KubeletHealthy calls; healthy says
	// which slots' kubelets passed one, readySeen whether a WaitReady saw
	// a Node Ready, and criEarly which slots' CRI sockets were asked for
	// before both.
	sickPolls int
	healthy   map[string]bool
	readySeen bool
	criEarly  []string
}

func newHost() *host {
	return &host{provisioned: map[string]bool{"a": true}, running: map[string]bool{"a": true}, booted: map[string]bool{"a": true},
		broken: map[string]bool{}, fail: map[string]error{}, cfgOf: map[string]string{}, started: map[string]time.Time{},
		nodeLabels:    map[string]string{"tier": "old", "kubernetes.io/hostname": "node1"},
		serverVersion: "v1.37.2", binary: map[string]string{"a": "1.37.2"}}
}

func (h *host) do(op, slot string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, op+":"+slot)
	return h.fail[op+":"+slot]
}

func (h *host) callList() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.calls, " ")
}

func (h *host) count(call string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.calls {
		if c == call {
			n++
		}
	}
	return n
}

type fakeBackend struct {
	h   *host
	cfg *config.Config
}

func (b *fakeBackend) Provision(ctx context.Context, slot string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.h.do("provision", slot); err != nil {
		return err
	}
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	if b.h.booted[slot] {
		return fmt.Errorf("provision %s: running", slot)
	}
	b.h.provisioned[slot], b.h.cfgOf[slot] = true, b.cfg.Fingerprint()
	b.h.binary[slot] = b.cfg.Kubernetes.Version
	if b.h.servedVersion != "" {
		b.h.binary[slot] = b.h.servedVersion
	}
	return nil
}

func (b *fakeBackend) KubeletVersion(ctx context.Context, slot string) (string, error) {
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	if !b.h.booted[slot] { // a warm machine answers too
		return "", fmt.Errorf("the node of slot %s is not running", slot)
	}
	return b.h.binary[slot], nil
}

// PatchKubelet: the slot's binary becomes the configuration's release.
func (b *fakeBackend) PatchKubelet(ctx context.Context, slot string) error {
	if err := b.h.do("patch", slot); err != nil {
		return err
	}
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	b.h.binary[slot] = b.cfg.Kubernetes.Version
	if v, ok := b.h.mirror[b.cfg.Kubernetes.Version]; ok {
		b.h.binary[slot] = v
	}
	return nil
}

func (b *fakeBackend) Configure(ctx context.Context, slot string) error {
	return b.h.do("configure", slot)
}

func (b *fakeBackend) Boot(ctx context.Context, slot string) error {
	if err := b.h.do("warm", slot); err != nil {
		return err
	}
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	if !b.h.provisioned[slot] {
		return fmt.Errorf("boot %s: not provisioned", slot)
	}
	b.h.booted[slot] = true
	return nil
}

func (b *fakeBackend) Start(ctx context.Context, slot string) error {
	if err := b.h.do("start", slot); err != nil {
		return err
	}
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	if !b.h.provisioned[slot] {
		return fmt.Errorf("start %s: not provisioned", slot)
	}
	if !b.h.running[slot] {
		b.h.started[slot] = time.Now()
	}
	b.h.running[slot], b.h.booted[slot] = true, true
	return nil
}

func (b *fakeBackend) Stop(ctx context.Context, slot string) error {
	if err := b.h.do("stop", slot); err != nil {
		return err
	}
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	b.h.running[slot], b.h.booted[slot] = false, false
	return nil
}

func (b *fakeBackend) Remove(ctx context.Context, slot string) error {
	if err := b.h.do("remove", slot); err != nil {
		return err
	}
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	if b.h.booted[slot] {
		return fmt.Errorf("remove %s: running", slot)
	}
	b.h.provisioned[slot] = false
	return nil
}

func (b *fakeBackend) Exec(ctx context.Context, slot string, args ...string) ([]byte, error) {
	return nil, errors.New("no exec in the fake")
}

func (b *fakeBackend) KubeletStartedAt(ctx context.Context, slot string) (time.Time, error) {
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	if !b.h.running[slot] {
		return time.Time{}, fmt.Errorf("kubelet of %s not running", slot)
	}
	return b.h.started[slot], nil
}

// CRISocket names a fake socket per slot; fail["cri:<slot>"] fails it.
func (b *fakeBackend) CRISocket(ctx context.Context, slot string) (string, error) {
	b.h.mu.Lock()
	if !b.h.healthy[slot] || !b.h.readySeen {
		b.h.criEarly = append(b.h.criEarly, slot)
	}
	b.h.mu.Unlock()
	if err := b.h.fail["cri:"+slot]; err != nil {
		return "", err
	}
	return "/fake/" + slot + ".sock", nil
}

func (b *fakeBackend) KubeletHealthy(ctx context.Context, slot string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	if !b.h.running[slot] || b.h.broken[slot] {
		return fmt.Errorf("kubelet of %s not healthy", slot)
	}
	if b.h.sickPolls > 0 {
		b.h.sickPolls--
		return fmt.Errorf("kubelet of %s still starting", slot)
	}
	if b.h.healthy == nil {
		b.h.healthy = map[string]bool{}
	}
	b.h.healthy[slot] = true
	return nil
}

type fakeOperator struct{ b *fakeBackend }

func (o *fakeOperator) EnsureHooks(ctx context.Context) error { return nil }
func (o *fakeOperator) RestartNode(ctx context.Context, slot string) (time.Time, error) {
	down := time.Now()
	if err := o.b.Stop(ctx, slot); err != nil {
		return down, err
	}
	return down, o.b.Start(ctx, slot)
}

// fakeCluster: the Node is Ready once some slot's kubelet is healthy.
type fakeCluster struct{ h *host }

func (c *fakeCluster) WaitReady(ctx context.Context, cfg *config.Config, since time.Time) error {
	c.h.mu.Lock()
	c.h.waitedSince = append(c.h.waitedSince, since)
	c.h.mu.Unlock()
	for {
		c.h.mu.Lock()
		ok := false
		for s, r := range c.h.running {
			ok = ok || (r && !c.h.broken[s])
		}
		c.h.readySeen = c.h.readySeen || ok
		c.h.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (c *fakeCluster) ServerVersion(ctx context.Context, cfg *config.Config) (string, error) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if c.h.serverVersion == "" {
		return "", errors.New("connection refused")
	}
	return c.h.serverVersion, nil
}

// KubeletVersion: the Node reports what the running slot's binary is.
func (c *fakeCluster) KubeletVersion(ctx context.Context, cfg *config.Config) (string, error) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	for s, r := range c.h.running {
		if r {
			return "v" + c.h.binary[s], nil
		}
	}
	return "", errors.New("no Node")
}

// fakeReleases pins nothing (the test configurations name their kubelet)
// and counts the calls.
type fakeReleases struct{ h *host }

func (r fakeReleases) Pin(ctx context.Context, cfg *config.Config) error {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.h.pins++
	return nil
}

func (c *fakeCluster) SetLabels(ctx context.Context, cfg *config.Config, set map[string]string, drop []string) error {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if c.h.labelErr != nil {
		return c.h.labelErr
	}
	for _, k := range drop {
		delete(c.h.nodeLabels, k)
	}
	for k, v := range set {
		c.h.nodeLabels[k] = v
	}
	return nil
}

func (h *host) labels() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var kv []string
	for k, v := range h.nodeLabels {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

type fakeBoot struct{ h *host }

func (f *fakeBoot) Move(ctx context.Context, from, to string) error {
	if err := f.h.do("boot", to); err != nil {
		return err
	}
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	f.h.moves = append(f.h.moves, from+"->"+to)
	return nil
}

// testConfig is node1's configuration with the label tier=label. Every one
// has the same CA (testkit.SharedCA), so configurations that differ only in
// what a fingerprint leaves out have the same fingerprint.
func testConfig(t *testing.T, label string) *config.Config {
	t.Helper()
	return testhost.Config(t, testhost.Doc{Machine: "node1", CA: testkit.SharedCA(),
		KubernetesLines: fmt.Sprintf("labels = { \"tier\" = %q }\n", label),
		Tables:          "[timeouts]\nnode_ready = \"2s\"\n"})
}

// rig is a host root with slot a committed and running.
type rig struct {
	h    *host
	d    *Deps
	root *hostroot.Root
	dr   *fakeDrain
}

func newRig(t *testing.T) *rig {
	t.Helper()
	root := testkit.LaidOut(t)
	h := newHost()
	store := state.NewStore(root)
	old := testConfig(t, "old")
	a, err := isolation.NewApplied("a", old, "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SaveApplied(a); err != nil {
		t.Fatal(err)
	}
	if err := store.SetActive("a"); err != nil {
		t.Fatal(err)
	}
	d := &Deps{
		Root: root, Log: slog.New(slog.DiscardHandler), Store: store, Requests: requests.New(root),
		Isolation: func(m isolation.Mode, cfg *config.Config) (isolation.Backend, isolation.Operator, error) {
			b := &fakeBackend{h: h, cfg: cfg}
			return b, &fakeOperator{b: b}, nil
		},
		Cluster: &fakeCluster{h: h}, Releases: fakeReleases{h: h}, Boot: &fakeBoot{h: h}, AgentVersion: "test", Poll: 5 * time.Millisecond,
		DrainPoll: 2 * time.Millisecond,
	}
	dr := &fakeDrain{h: h, pods: []drain.Pod{{Namespace: "default", Name: "web", UID: "1"}}, blocked: map[string]bool{}}
	d.Drain = func(*config.Config) (drain.Cluster, error) { return dr, nil }
	return &rig{h: h, d: d, root: root, dr: dr}
}

// request drops a repave request with a new label, as the watcher would.
func (r *rig) request(t *testing.T, gen int64) *requests.Request {
	t.Helper()
	return r.requestConfig(t, gen, testConfig(t, "new"))
}

// requestConfig drops a repave request of generation gen for desired.
func (r *rig) requestConfig(t *testing.T, gen int64, desired *config.Config) *requests.Request {
	t.Helper()
	req := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, gen, ""), MachineGeneration: gen,
		Reason: "spec changed", Desired: desired, CreatedAt: time.Now()}
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
	return req
}

func (r *rig) active(t *testing.T) *state.Applied {
	t.Helper()
	a, err := r.d.Store.ActiveApplied()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// fakeDrain is the Node and its pods as lib/drain sees them: cordons,
// uncordons and evictions are host calls ("cordon:node1", "evict:web").
// blocked pods are guarded by a budget; err fails every call.
type fakeDrain struct {
	h       *host
	node    drain.Node
	pods    []drain.Pod
	blocked map[string]bool
	err     error
}

func (f *fakeDrain) GetNode(ctx context.Context, name string) (*drain.Node, error) {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	n := f.node
	return &n, nil
}

func (f *fakeDrain) PatchNode(ctx context.Context, name, rv string, unschedulable bool, by string) error {
	op := "uncordon"
	if unschedulable {
		op = "cordon"
	}
	if err := f.h.do(op, name); err != nil {
		return err
	}
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	f.node.Unschedulable, f.node.CordonedBy = unschedulable, by
	return nil
}

func (f *fakeDrain) ListPods(ctx context.Context, node string) ([]drain.Pod, error) {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	return slices.Clone(f.pods), f.err
}

func (f *fakeDrain) Evict(ctx context.Context, p drain.Pod) error {
	if err := f.h.do("evict", p.Name); err != nil {
		return err
	}
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	if f.blocked[p.Name] {
		return &drain.BlockedError{PDB: p.Namespace + "/guard", Message: "needs 1 healthy pods"}
	}
	f.pods = slices.DeleteFunc(f.pods, func(x drain.Pod) bool { return x.Name == p.Name })
	return nil
}

// ListPDBs: no budgets (the preflight's own tests are lib/drain's).
func (f *fakeDrain) ListPDBs(ctx context.Context, namespace string) ([]drain.PDB, error) {
	return nil, nil
}

func (f *fakeDrain) cordoned() bool {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	return f.node.Unschedulable
}
