package rollout

// The rollout rig's observers: a stand-in scheduler that spreads pods over Ready, schedulable nodes, and the
// sampler that watches a rollout from outside (TestRolloutOnRig).

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// spreadScheduler stands in for kube-scheduler on the rig's nodes: every 200 ms it binds the pods of ns that no node
// has to the schedulable, Ready node among nodes with the fewest pods of ns (name order on a tie), until ctx ends.
// What a scheduler does here that matters to the test: replacements of evicted pods never land on a cordoned node.
func spreadScheduler(ctx context.Context, cs *kubernetes.Clientset, ns string, nodes []string) {
	for ctx.Err() == nil {
		spreadOnce(ctx, cs, ns, nodes)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func spreadOnce(ctx context.Context, cs *kubernetes.Clientset, ns string, nodes []string) {
	count := map[string]int{}
	for _, name := range nodes {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || n.Spec.Unschedulable || !nodeReady(n) {
			continue
		}
		count[name] = 0
	}
	if len(count) == 0 {
		return
	}
	l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	var pending []corev1.Pod
	for _, p := range l.Items {
		switch {
		case p.DeletionTimestamp != nil:
		case p.Spec.NodeName == "":
			pending = append(pending, p)
		default:
			if _, ok := count[p.Spec.NodeName]; ok {
				count[p.Spec.NodeName]++
			}
		}
	}
	for _, p := range pending {
		names := make([]string, 0, len(count))
		for n := range count {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool {
			if count[names[i]] != count[names[j]] {
				return count[names[i]] < count[names[j]]
			}
			return names[i] < names[j]
		})
		err := cs.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns},
			Target: corev1.ObjectReference{Kind: "Node", Name: names[0]}}, metav1.CreateOptions{})
		if err == nil {
			count[names[0]]++
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// rolloutSampler watches one rollout from outside every 100 ms: the nodes disrupted at once, the Ready pods, and
// how each pod that went away went.
type rolloutSampler struct {
	rr   *rolloutRig
	op   string
	stop func()
	done chan struct{}

	mu         sync.Mutex
	samples    int
	maxAtOnce  int
	worst      string // the sample with the most disrupted nodes
	maxNodes   int    // the most nodes cordoned or NotReady in one sample (the operation's status aside)
	minReady   int
	cordoned   map[string]bool
	disrupted  map[string]bool
	pods       map[types.UID]*podTrace
	lostReady  []string // a pod that turned unready without terminating: killed with its node, not evicted
	sampleErrs int
}

// podTrace is what the sampler saw of one pod.
type podTrace struct {
	name, node string
	ready      bool
	// terminating: seen with a deletionTimestamp; cordoned: its node was cordoned in that sample; reason: its
	// DisruptionTarget condition's reason (EvictionByEvictionAPI for an eviction); gone: not listed any more.
	terminating, cordoned, gone bool
	reason                      string
}

// sample starts a sampler for operation op; its stop is idempotent.
func (rr *rolloutRig) sample(op string) *rolloutSampler {
	s := &rolloutSampler{rr: rr, op: op, minReady: -1, cordoned: map[string]bool{}, disrupted: map[string]bool{},
		pods: map[types.UID]*podTrace{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	var once sync.Once
	s.stop = func() { once.Do(func() { cancel(); <-s.done }) }
	rr.t.Cleanup(s.stop)
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			s.once(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return s
}

func (s *rolloutSampler) once(ctx context.Context) {
	rr := s.rr
	nodes, err := rr.admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		s.note()
		return
	}
	op, opErr := rr.mc.GetOperation(ctx, s.op)
	pods, err := rr.admin.CoreV1().Pods(rr.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		s.note()
		return
	}
	why := map[string][]string{}
	cordonedNow := map[string]bool{}
	for _, n := range nodes.Items {
		if !slices.Contains(rr.nodes, n.Name) {
			continue
		}
		if n.Spec.Unschedulable {
			why[n.Name] = append(why[n.Name], "cordoned")
			cordonedNow[n.Name] = true
		}
		if !nodeReady(&n) {
			why[n.Name] = append(why[n.Name], "NotReady")
		}
	}
	if opErr == nil {
		for _, e := range op.Status.Machines {
			if e.Phase == v1alpha1.OperationInProgress {
				why[e.NodeName] = append(why[e.NodeName], "repave InProgress")
			}
		}
	}
	ready := 0
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	listed := map[types.UID]bool{}
	for _, p := range pods.Items {
		listed[p.UID] = true
		tr := s.pods[p.UID]
		if tr == nil {
			tr = &podTrace{name: p.Name}
			s.pods[p.UID] = tr
		}
		tr.node = p.Spec.NodeName
		r := podReady(&p)
		if p.DeletionTimestamp == nil && r {
			ready++
		}
		if p.DeletionTimestamp != nil && !tr.terminating {
			tr.terminating, tr.cordoned = true, cordonedNow[p.Spec.NodeName]
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				tr.reason = c.Reason
			}
		}
		if tr.ready && !r && p.DeletionTimestamp == nil {
			s.lostReady = append(s.lostReady, fmt.Sprintf("%s on %s at %s", p.Name, p.Spec.NodeName, time.Now().Format("15:04:05.000")))
		}
		tr.ready = r
	}
	for uid, tr := range s.pods {
		if !listed[uid] {
			tr.gone = true
		}
	}
	if s.minReady < 0 || ready < s.minReady {
		s.minReady = ready
	}
	for n := range why {
		s.disrupted[n] = true
	}
	for n := range cordonedNow {
		s.cordoned[n] = true
	}
	bad := 0
	for _, w := range why {
		if slices.Contains(w, "cordoned") || slices.Contains(w, "NotReady") {
			bad++
		}
	}
	s.maxNodes = max(s.maxNodes, bad)
	if len(why) > s.maxAtOnce {
		s.maxAtOnce = len(why)
		s.worst = fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), why)
	}
}

func (s *rolloutSampler) note() { s.mu.Lock(); s.sampleErrs++; s.mu.Unlock() }

// check: at most maxAtOnce nodes disrupted in any sample (and some node was, or the sampling proved nothing), at most
// one cordoned or NotReady, never fewer than minReady pods Ready, no pod turned unready without being evicted.
func (s *rolloutSampler) check(t *testing.T, what string, maxAtOnce, minReady int) {
	t.Helper()
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("%s: %d samples (%d failed reads), at most %d nodes disrupted at once (%s), fewest Ready pods %d", what, s.samples,
		s.sampleErrs, s.maxAtOnce, s.worst, s.minReady)
	if s.maxAtOnce > maxAtOnce || s.maxAtOnce == 0 {
		t.Errorf("%s: %d nodes disrupted at once (%s), want %d", what, s.maxAtOnce, s.worst, maxAtOnce)
	}
	if s.maxNodes > 1 {
		t.Errorf("%s: %d nodes cordoned or NotReady at once", what, s.maxNodes)
	}
	if s.minReady < minReady {
		t.Errorf("%s: %d pods Ready at the worst sample, the budget allows no fewer than %d", what, s.minReady, minReady)
	}
	if len(s.lostReady) > 0 {
		t.Errorf("%s: pods turned unready without being evicted (killed with their node?): %v", what, s.lostReady)
	}
}

// evictions checks every pod that went away was seen terminating from a cordoned node with the Eviction API's
// DisruptionTarget reason, and returns how many did.
func (s *rolloutSampler) evictions(t *testing.T) int {
	t.Helper()
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, tr := range s.pods {
		if !tr.gone && !tr.terminating {
			continue
		}
		switch {
		case !tr.terminating:
			t.Errorf("pod %s on %s vanished between two samples: not seen terminating", tr.name, tr.node)
		case tr.reason != "EvictionByEvictionAPI" || !tr.cordoned:
			t.Errorf("pod %s on %s went away with DisruptionTarget reason %q, node cordoned %v; want an eviction from a cordoned node",
				tr.name, tr.node, tr.reason, tr.cordoned)
		default:
			n++
		}
	}
	return n
}

func (s *rolloutSampler) everCordoned(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cordoned[node]
}

func (s *rolloutSampler) everDisrupted(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.disrupted[node]
}
