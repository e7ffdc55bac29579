// Package rollout is the agents' semaphore for a paced MachineOperation: a
// set of RolloutLeases (kubeslot.dev, one per slot, named "<op>-<i>"), taken
// with optimistic concurrency (create, or update at the resourceVersion
// read), renewed while held, deleted when the holder is done, and taken over
// when the holder has not renewed within the lease's duration, so a dead
// agent's slot frees itself. Any node may write a lease in its own name, so
// a lease counts as a held slot only when it has the slot's name, is owned
// by the operation, is held by one of the operation's targets and was
// renewed within the agents' own duration; any other lease is nobody's
// slot. The cluster is reached through the narrow Store interface; REST is
// the real one. Imported by lib/watcher.
package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// Store reads and writes RolloutLeases. Create returns an AlreadyExists
// error when the name is taken, Update and Delete a Conflict error when the
// resourceVersion given is not the current one, Get and Delete NotFound.
type Store interface {
	List(ctx context.Context, op string) ([]v1alpha1.RolloutLease, error)
	Get(ctx context.Context, name string) (*v1alpha1.RolloutLease, error)
	Create(ctx context.Context, l *v1alpha1.RolloutLease) (*v1alpha1.RolloutLease, error)
	Update(ctx context.Context, l *v1alpha1.RolloutLease) (*v1alpha1.RolloutLease, error)
	Delete(ctx context.Context, name, resourceVersion string) error
}

// Owner is the operation a slot belongs to; its leases carry it as owner
// reference, so the garbage collector deletes them with the operation.
type Owner struct {
	Name string
	UID  types.UID
}

// ErrLost is returned by Renew when the lease is gone or held by another.
var ErrLost = errors.New("rollout slot lost")

// Semaphore takes and keeps slots for one holder (the agent's node name).
// It is not safe for concurrent use; Keeper serialises it.
type Semaphore struct {
	Store    Store
	Holder   string
	Duration time.Duration
	// Now is the local clock (time.Now when nil).
	Now func() time.Time
	// seen remembers, per lease name, the resourceVersion last read and
	// when it was first read: a lease is expired when it has not changed
	// for its duration on this clock, so clock skew between hosts does not
	// matter (as client-go's leader election).
	seen map[string]sighting
}

type sighting struct {
	rv    string
	since time.Time
}

func (s *Semaphore) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Name is the name of slot i of operation op.
func Name(op string, i int) string { return op + "-" + strconv.Itoa(i) }

// Find returns the lease of op that the holder holds, nil if none.
func (s *Semaphore) Find(ctx context.Context, op Owner) (*v1alpha1.RolloutLease, error) {
	ls, err := s.Store.List(ctx, op.Name)
	if err != nil {
		return nil, err
	}
	return s.own(ls, op), nil
}

func (s *Semaphore) own(ls []v1alpha1.RolloutLease, op Owner) *v1alpha1.RolloutLease {
	for i := range ls {
		if ls[i].Spec.HolderIdentity == s.Holder && !Stale(&ls[i], op) {
			return &ls[i]
		}
	}
	return nil
}

// Stale reports whether l belongs to an earlier operation of op's name,
// deleted and created again: the garbage collector deletes such a lease in
// its own time, and until then it is nobody's slot (its holder may be this
// very agent, whose slot of the old operation says nothing of the new one).
// A lease with no owner, or an op with no UID, is not stale.
func Stale(l *v1alpha1.RolloutLease, op Owner) bool {
	if op.UID == "" {
		return false
	}
	for _, r := range l.OwnerReferences {
		if r.Kind == "MachineOperation" {
			return r.UID != op.UID
		}
	}
	return false
}

// expired reports whether l has not changed for its duration since this
// semaphore first saw it in this state. The duration is the lease's own,
// but never longer than this semaphore's: a holder cannot keep a slot for
// an hour by writing a long duration.
func (s *Semaphore) expired(l *v1alpha1.RolloutLease, now time.Time) bool {
	if s.seen == nil {
		s.seen = map[string]sighting{}
	}
	sg, ok := s.seen[l.Name]
	if !ok || sg.rv != l.ResourceVersion {
		s.seen[l.Name] = sighting{rv: l.ResourceVersion, since: now}
		return false
	}
	d := time.Duration(l.Spec.LeaseDurationSeconds) * time.Second
	if s.Duration > 0 {
		d = min(d, max(s.Duration, time.Second))
	}
	return now.Sub(sg.since) >= d
}

// TryAcquire makes one attempt to take one of the first slots slots of op:
// the holder's own lease if it has one already (a restarted agent keeps
// its slot), else a slot with no lease, an expired one or one that is
// nobody's (see held). It returns nil when every slot is held, or when
// another agent won the race. Leases of op at indexes beyond slots (the
// slot count grows after a canary) count as held while they live, so no
// more than slots are ever live at once. holders says which nodes may hold
// a slot (the operation's targets); nil trusts none but this holder.
func (s *Semaphore) TryAcquire(ctx context.Context, op Owner, slots int, holders func(string) bool) (*v1alpha1.RolloutLease, error) {
	if slots < 1 {
		return nil, fmt.Errorf("operation %s: %d slots: need at least 1", op.Name, slots)
	}
	ls, err := s.Store.List(ctx, op.Name)
	if err != nil {
		return nil, err
	}
	if l := s.own(ls, op); l != nil {
		return l, nil
	}
	now := s.now()
	byName := map[string]*v1alpha1.RolloutLease{}
	taken := map[string]bool{}
	live := 0
	for i := range ls {
		l := &ls[i]
		byName[l.Name] = l
		if s.held(l, op, holders, now) {
			taken[l.Name] = true
			live++
		}
	}
	for name := range s.seen {
		if _, ok := byName[name]; !ok && strings.HasPrefix(name, op.Name+"-") {
			delete(s.seen, name)
		}
	}
	if live >= slots {
		return nil, nil
	}
	for i := range slots {
		name := Name(op.Name, i)
		cur, ok := byName[name]
		switch {
		case !ok:
			l, err := s.Store.Create(ctx, s.fresh(op, name, now))
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			return l, err
		case !taken[name]:
			// Taken over in place: the owner reference too, so a stale
			// lease becomes the current operation's.
			f := s.fresh(op, name, now)
			next := cur.DeepCopy()
			next.Spec = f.Spec
			next.Spec.LeaseTransitions = cur.Spec.LeaseTransitions + 1
			next.Labels, next.OwnerReferences = f.Labels, f.OwnerReferences
			l, err := s.Store.Update(ctx, next)
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				continue
			}
			return l, err
		}
	}
	return nil, nil
}

// held reports whether l is a live slot of op: named as slot i of op, owned
// by op, held by a node holders names, and not expired. Anything else (a
// lease a node made up with another name, no owner or a long duration, or
// one held by a node that is no target) is counted as nothing, and a slot
// it sits on may be taken over. It is called once per lease per attempt, as
// expired keeps its sightings.
func (s *Semaphore) held(l *v1alpha1.RolloutLease, op Owner, holders func(string) bool, now time.Time) bool {
	exp := s.expired(l, now)
	switch {
	case exp, Stale(l, op), !slotName(l.Name, op.Name), !ownedBy(l, op):
		return false
	}
	return l.Spec.HolderIdentity == s.Holder || (holders != nil && holders(l.Spec.HolderIdentity))
}

// slotName reports whether name is "<op>-<i>" for a slot index i.
func slotName(name, op string) bool {
	i, ok := strings.CutPrefix(name, op+"-")
	if !ok || i == "" || (len(i) > 1 && i[0] == '0') {
		return false
	}
	n, err := strconv.Atoi(i)
	return err == nil && n >= 0
}

// ownedBy reports whether l carries op as its owner (any lease does for an
// op without a UID: tests and tools that name no operation object).
func ownedBy(l *v1alpha1.RolloutLease, op Owner) bool {
	if op.UID == "" {
		return true
	}
	for _, r := range l.OwnerReferences {
		if r.Kind == "MachineOperation" && r.Name == op.Name && r.UID == op.UID {
			return true
		}
	}
	return false
}

func (s *Semaphore) fresh(op Owner, name string, now time.Time) *v1alpha1.RolloutLease {
	t := metav1.NewMicroTime(now)
	l := &v1alpha1.RolloutLease{Spec: v1alpha1.RolloutLeaseSpec{
		HolderIdentity: s.Holder, LeaseDurationSeconds: int32(max(1, s.Duration/time.Second)),
		AcquireTime: &t, RenewTime: t.DeepCopy(),
	}}
	l.Name = name
	l.Labels = map[string]string{v1alpha1.LabelOperation: op.Name}
	if op.UID != "" {
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(),
			Kind: "MachineOperation", Name: op.Name, UID: op.UID}}
	}
	return l
}

// Renew moves l's renewTime to now. A conflict is resolved by reading the
// lease again: still the holder's (its own earlier write), it retries;
// another's or gone, ErrLost.
func (s *Semaphore) Renew(ctx context.Context, l *v1alpha1.RolloutLease) (*v1alpha1.RolloutLease, error) {
	for range 3 {
		next := l.DeepCopy()
		t := metav1.NewMicroTime(s.now())
		next.Spec.RenewTime = &t
		out, err := s.Store.Update(ctx, next)
		switch {
		case err == nil:
			return out, nil
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("%w: lease %s is gone", ErrLost, l.Name)
		case !apierrors.IsConflict(err):
			return nil, err
		}
		cur, err := s.Store.Get(ctx, l.Name)
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: lease %s is gone", ErrLost, l.Name)
		}
		if err != nil {
			return nil, err
		}
		if cur.Spec.HolderIdentity != s.Holder {
			return nil, fmt.Errorf("%w: lease %s is held by %s now", ErrLost, l.Name, cur.Spec.HolderIdentity)
		}
		l = cur
	}
	return nil, fmt.Errorf("renew lease %s: conflicts on every attempt", l.Name)
}

// Release deletes the holder's lease name, at the resourceVersion it reads
// first; a lease held by another (taken over) or gone is left alone.
func (s *Semaphore) Release(ctx context.Context, name string) error {
	for range 3 {
		cur, err := s.Store.Get(ctx, name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur.Spec.HolderIdentity != s.Holder {
			return nil
		}
		err = s.Store.Delete(ctx, name, cur.ResourceVersion)
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("release lease %s: conflicts on every attempt", name)
}

// Names lists the names of leases, sorted (for logs and tests).
func Names(ls []v1alpha1.RolloutLease) []string {
	out := make([]string, 0, len(ls))
	for _, l := range ls {
		out = append(out, l.Name+"="+l.Spec.HolderIdentity)
	}
	slices.Sort(out)
	return out
}
