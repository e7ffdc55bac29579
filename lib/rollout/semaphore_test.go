package rollout

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// fakeStore is a Store with the apiserver's optimistic concurrency.
type fakeStore struct {
	mu     sync.Mutex
	rv     int
	leases map[string]*v1alpha1.RolloutLease
	calls  int
}

func newFake() *fakeStore { return &fakeStore{leases: map[string]*v1alpha1.RolloutLease{}} }

var gr = v1alpha1.Resource(v1alpha1.RolloutLeasesResource)

func (f *fakeStore) List(_ context.Context, op string) ([]v1alpha1.RolloutLease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	var out []v1alpha1.RolloutLease
	for _, l := range f.leases {
		if l.Labels[v1alpha1.LabelOperation] == op {
			out = append(out, *l.DeepCopy())
		}
	}
	return out, nil
}

func (f *fakeStore) Get(_ context.Context, name string) (*v1alpha1.RolloutLease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	l, ok := f.leases[name]
	if !ok {
		return nil, apierrors.NewNotFound(gr, name)
	}
	return l.DeepCopy(), nil
}

func (f *fakeStore) Create(_ context.Context, l *v1alpha1.RolloutLease) (*v1alpha1.RolloutLease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if _, ok := f.leases[l.Name]; ok {
		return nil, apierrors.NewAlreadyExists(gr, l.Name)
	}
	f.rv++
	c := l.DeepCopy()
	c.ResourceVersion = strconv.Itoa(f.rv)
	f.leases[l.Name] = c
	return c.DeepCopy(), nil
}

func (f *fakeStore) Update(_ context.Context, l *v1alpha1.RolloutLease) (*v1alpha1.RolloutLease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	cur, ok := f.leases[l.Name]
	if !ok {
		return nil, apierrors.NewNotFound(gr, l.Name)
	}
	if cur.ResourceVersion != l.ResourceVersion {
		return nil, apierrors.NewConflict(gr, l.Name, errors.New("changed"))
	}
	f.rv++
	c := l.DeepCopy()
	c.ResourceVersion = strconv.Itoa(f.rv)
	f.leases[l.Name] = c
	return c.DeepCopy(), nil
}

func (f *fakeStore) Delete(_ context.Context, name, rv string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	cur, ok := f.leases[name]
	if !ok {
		return apierrors.NewNotFound(gr, name)
	}
	if cur.ResourceVersion != rv {
		return apierrors.NewConflict(gr, name, errors.New("changed"))
	}
	delete(f.leases, name)
	return nil
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func sem(f *fakeStore, holder string, c *clock) *Semaphore {
	return &Semaphore{Store: f, Holder: holder, Duration: 30 * time.Second, Now: c.now}
}

var op = Owner{Name: "roll", UID: "uid-1"}

func TestSlotsAreExclusive(t *testing.T) {
	ctx := context.Background()
	f, c := newFake(), &clock{t: time.Unix(1000, 0)}
	a, b, x := sem(f, "a", c), sem(f, "b", c), sem(f, "x", c)
	la, err := a.TryAcquire(ctx, op, 2, anyNode)
	if err != nil || la == nil || la.Name != "roll-0" {
		t.Fatalf("a: %v %v, want roll-0", la, err)
	}
	if la.OwnerReferences[0].UID != "uid-1" || la.Labels[v1alpha1.LabelOperation] != "roll" {
		t.Errorf("lease carries no owner or label: %+v", la.ObjectMeta)
	}
	lb, _ := b.TryAcquire(ctx, op, 2, anyNode)
	if lb == nil || lb.Name != "roll-1" {
		t.Fatalf("b: %v, want roll-1", lb)
	}
	if lx, _ := x.TryAcquire(ctx, op, 2, anyNode); lx != nil {
		t.Fatalf("x took %s while both slots are held", lx.Name)
	}
	// Again for a: its own slot, not a second one.
	if again, _ := a.TryAcquire(ctx, op, 2, anyNode); again == nil || again.Name != "roll-0" {
		t.Errorf("a again: %v, want its roll-0", again)
	}
	if err := a.Release(ctx, "roll-0"); err != nil {
		t.Fatal(err)
	}
	if lx, _ := x.TryAcquire(ctx, op, 2, anyNode); lx == nil || lx.Name != "roll-0" {
		t.Errorf("x after a released: %v, want roll-0", lx)
	}
	// A slot count that shrinks (the canary) still counts every live lease.
	if ly, _ := sem(f, "y", c).TryAcquire(ctx, op, 1, anyNode); ly != nil {
		t.Errorf("y took %s with 1 slot and 2 live leases", ly.Name)
	}
}

func TestExpiredSlotIsTakenOver(t *testing.T) {
	ctx := context.Background()
	f, c := newFake(), &clock{t: time.Unix(1000, 0)}
	a, b := sem(f, "a", c), sem(f, "b", c)
	la, _ := a.TryAcquire(ctx, op, 1, anyNode)
	if la == nil {
		t.Fatal("a took nothing")
	}
	if lb, _ := b.TryAcquire(ctx, op, 1, anyNode); lb != nil {
		t.Fatal("b took a live slot")
	}
	// a renews within its duration: b must not take it, however long it
	// waits in all.
	for range 4 {
		c.t = c.t.Add(20 * time.Second)
		var err error
		if la, err = a.Renew(ctx, la); err != nil {
			t.Fatal(err)
		}
		if lb, _ := b.TryAcquire(ctx, op, 1, anyNode); lb != nil {
			t.Fatalf("b took a slot renewed %v ago", 0)
		}
	}
	// a stops renewing (dead): after the duration on b's clock, b takes it.
	c.t = c.t.Add(29 * time.Second)
	if lb, _ := b.TryAcquire(ctx, op, 1, anyNode); lb != nil {
		t.Fatal("b took the slot before the duration passed")
	}
	c.t = c.t.Add(2 * time.Second)
	lb, err := b.TryAcquire(ctx, op, 1, anyNode)
	if err != nil || lb == nil || lb.Spec.HolderIdentity != "b" || lb.Spec.LeaseTransitions != 1 {
		t.Fatalf("b after expiry: %+v %v, want b's with 1 transition", lb, err)
	}
	// a comes back: its renewal fails as lost, its release leaves b's lease.
	if _, err := a.Renew(ctx, la); !errors.Is(err, ErrLost) {
		t.Errorf("a's renewal after the takeover: %v, want ErrLost", err)
	}
	if err := a.Release(ctx, "roll-0"); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.Get(ctx, "roll-0"); got == nil || got.Spec.HolderIdentity != "b" {
		t.Errorf("a's release touched b's lease: %+v", got)
	}
}

func TestRenewAfterOwnWriteConflict(t *testing.T) {
	ctx := context.Background()
	f, c := newFake(), &clock{t: time.Unix(1000, 0)}
	a := sem(f, "a", c)
	la, _ := a.TryAcquire(ctx, op, 1, anyNode)
	if _, err := a.Renew(ctx, la); err != nil {
		t.Fatal(err)
	}
	// la is stale now (its write went through, its answer was "lost").
	if _, err := a.Renew(ctx, la); err != nil {
		t.Errorf("renew from a stale copy of its own lease: %v, want a retry that succeeds", err)
	}
}

func TestKeeperPacesAndRecovers(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	busy := NewKeeper(f, "busy", time.Minute, time.Hour, nil)
	if ok, _, err := busy.Try(ctx, op, 1, anyNode); !ok || err != nil {
		t.Fatalf("busy: %v %v", ok, err)
	}
	k := NewKeeper(f, "k", time.Minute, time.Hour, nil)
	for i := range 5 {
		ok, wait, err := k.Try(ctx, op, 1, anyNode)
		if ok || err != nil || wait <= 0 {
			t.Fatalf("attempt %d: %v %v %v, want a wait", i, ok, wait, err)
		}
	}
	if f.calls != 3 {
		t.Errorf("%d store calls for 1 + 5 attempts within one interval, want 3 (List and Create, then one List)", f.calls)
	}
	// A restarted busy agent finds its slot on the server, then releases it.
	again := NewKeeper(f, "busy", time.Minute, time.Hour, nil)
	if again.Held(op) {
		t.Fatal("a new keeper remembers a slot")
	}
	if ok, err := again.Recover(ctx, op); !ok || err != nil {
		t.Fatalf("recover: %v %v", ok, err)
	}
	if err := NewKeeper(f, "busy", time.Minute, time.Hour, nil).Release(ctx, op); err != nil {
		t.Fatal(err)
	}
	if len(f.leases) != 0 {
		t.Errorf("leases left after release: %v", f.leases)
	}
}

// TestStaleLeasesOfARecreatedOperation: an operation deleted and created
// again under its name finds the old one's leases until the garbage
// collector deletes them. They are nobody's slot: not the holder's own (its
// slot of the old operation), and not live, so the first taker makes one
// the new operation's, owner reference included.
func TestStaleLeasesOfARecreatedOperation(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	old := Owner{Name: "roll", UID: "uid-old"}
	a := NewKeeper(f, "a", time.Minute, time.Millisecond, nil)
	if ok, _, err := a.Try(ctx, old, 1, anyNode); !ok || err != nil {
		t.Fatalf("take a slot of the old operation: %v %v", ok, err)
	}
	// The operation is recreated; the old lease (held by a, unexpired) is
	// still there.
	cur := Owner{Name: "roll", UID: "uid-new"}
	if a.Held(cur) {
		t.Error("the keeper counts its slot of the old operation as one of the new")
	}
	restarted := NewKeeper(f, "a", time.Minute, time.Millisecond, nil)
	if ok, err := restarted.Recover(ctx, cur); ok || err != nil {
		t.Errorf("recover for the new operation: %v %v, want no slot (the lease is the old one's)", ok, err)
	}
	b := NewKeeper(f, "b", time.Minute, time.Millisecond, nil)
	if ok, _, err := b.Try(ctx, cur, 1, anyNode); !ok || err != nil {
		t.Fatalf("b's attempt on the new operation: %v %v, want the stale slot", ok, err)
	}
	l := f.leases[Name("roll", 0)]
	if l.Spec.HolderIdentity != "b" || len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != "uid-new" {
		t.Errorf("lease after the take-over: holder %q owners %+v, want b and uid-new", l.Spec.HolderIdentity, l.OwnerReferences)
	}
	// Now the slot is live for the new operation: a cannot take it.
	time.Sleep(2 * time.Millisecond)
	if ok, _, err := a.Try(ctx, cur, 1, anyNode); ok || err != nil {
		t.Errorf("a's attempt while b holds the new operation's slot: %v %v", ok, err)
	}
	// a's release for the new operation gives back nothing of b's.
	if err := a.Release(ctx, cur); err != nil || f.leases[Name("roll", 0)] == nil {
		t.Errorf("a's release: %v, lease %v", err, f.leases[Name("roll", 0)])
	}
}

// anyNode lets every node hold a slot (the tests' agents are all targets).
func anyNode(string) bool { return true }

// TestLeasesNoTargetMayHoldCountForNothing: leases a node wrote for itself
// outside the rollout's shape (another name, no owner, an hour's duration, a
// holder that is no target) are nobody's slot: they neither block a target
// nor last longer than the agents' own duration.
func TestLeasesNoTargetMayHoldCountForNothing(t *testing.T) {
	ctx := context.Background()
	targets := func(n string) bool { return n == "a" || n == "b" || n == "t" }
	hour := int32(3600)
	forge := func(name, holder string, owned bool) *v1alpha1.RolloutLease {
		l := &v1alpha1.RolloutLease{Spec: v1alpha1.RolloutLeaseSpec{HolderIdentity: holder, LeaseDurationSeconds: hour}}
		l.Name, l.Labels = name, map[string]string{v1alpha1.LabelOperation: op.Name}
		if owned {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(),
				Kind: "MachineOperation", Name: op.Name, UID: op.UID}}
		}
		return l
	}
	cases := []struct {
		name  string
		lease *v1alpha1.RolloutLease
	}{
		{"ownerless on slot 0", forge("roll-0", "x", false)},
		{"a name of no slot", forge("roll-anything", "x", true)},
		{"held by a node that is no target", forge("roll-0", "x", true)},
		{"a zero-padded slot name", forge("roll-00", "t", true)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			c := &clock{t: time.Unix(1000, 0)}
			if _, err := f.Create(ctx, tc.lease); err != nil {
				t.Fatal(err)
			}
			l, err := sem(f, "a", c).TryAcquire(ctx, op, 1, targets)
			if err != nil || l == nil || l.Spec.HolderIdentity != "a" {
				t.Fatalf("a target's attempt on a one-slot rollout: %+v, %v; want the slot", l, err)
			}
			if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != op.UID {
				t.Errorf("the slot taken: owners %+v, want the operation", l.OwnerReferences)
			}
		})
	}
	// A target's own lease with an hour's duration lasts as long as the agents' duration, not an hour.
	f := newFake()
	c := &clock{t: time.Unix(1000, 0)}
	if _, err := f.Create(ctx, forge("roll-0", "t", true)); err != nil {
		t.Fatal(err)
	}
	b := sem(f, "b", c)
	if l, _ := b.TryAcquire(ctx, op, 1, targets); l != nil {
		t.Fatalf("b took a live target's slot at once: %+v", l)
	}
	c.t = c.t.Add(31 * time.Second)
	if l, _ := b.TryAcquire(ctx, op, 1, targets); l == nil || l.Spec.HolderIdentity != "b" {
		t.Errorf("after the agents' 30 s without a renewal: %+v, want b's (the lease's 3600 s is not believed)", l)
	}
	// nil holders trusts no other node.
	f = newFake()
	if _, err := f.Create(ctx, forge("roll-0", "t", true)); err != nil {
		t.Fatal(err)
	}
	if l, _ := sem(f, "a", c).TryAcquire(ctx, op, 1, nil); l == nil {
		t.Error("with no holders named, another node's lease still counted")
	}
}

// TestKeeperTellsOfALostSlot: a slot taken over by another node (as any node
// may, in its own name) is reported to OnLost at the next renewal.
func TestKeeperTellsOfALostSlot(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	a := NewKeeper(f, "a", time.Minute, time.Millisecond, nil)
	var lost []string
	a.OnLost = func(op, reason string) { lost = append(lost, op+": "+reason) }
	if ok, _, err := a.Try(ctx, op, 1, anyNode); !ok || err != nil {
		t.Fatalf("take the slot: %v %v", ok, err)
	}
	a.Renew(ctx)
	if len(lost) != 0 {
		t.Fatalf("renewed a slot still held: lost %v", lost)
	}
	l := f.leases[Name(op.Name, 0)].DeepCopy()
	l.Spec.HolderIdentity = "x"
	if _, err := f.Update(ctx, l); err != nil {
		t.Fatal(err)
	}
	a.Renew(ctx)
	if len(lost) != 1 || !strings.Contains(lost[0], "roll: ") || !strings.Contains(lost[0], "held by x") {
		t.Errorf("after the take-over: lost %v, want one report naming x", lost)
	}
	if a.Held(op) {
		t.Error("the keeper still counts the slot held")
	}
}
