package rollout

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// Keeper holds an agent's slots across its decisions: it paces the
// attempts to take one (one List per operation per Interval, jittered, so
// a waiting agent's requests per minute do not grow with the fleet),
// renews what it holds every third of the lease duration, and finds a slot
// it held before a restart on the server, never in a file.
type Keeper struct {
	sem      *Semaphore
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	held    map[string]*v1alpha1.RolloutLease // by operation
	checked map[string]bool                   // operations looked up on the server by this process
	next    map[string]time.Time              // earliest next attempt, by operation
	uid     map[string]types.UID              // the operation UID the entries above are of, by operation

	// OnLost, when set, is told of each slot Renew finds lost (the
	// operation's name and what was seen), so that the work started under
	// it stops before it disrupts the node. It runs with the keeper locked
	// and must not call back into it.
	OnLost func(op, reason string)
}

// Defaults of NewKeeper.
const (
	DefaultDuration = 60 * time.Second
	DefaultInterval = 10 * time.Second
)

// NewKeeper keeps slots for holder in store, with leases of duration d and
// an attempt every interval (defaults for zero values).
func NewKeeper(store Store, holder string, d, interval time.Duration, log *slog.Logger) *Keeper {
	if d <= 0 {
		d = DefaultDuration
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Keeper{sem: &Semaphore{Store: store, Holder: holder, Duration: d}, interval: interval, log: log,
		held: map[string]*v1alpha1.RolloutLease{}, checked: map[string]bool{}, next: map[string]time.Time{},
		uid: map[string]types.UID{}}
}

// Held reports whether the keeper holds a slot of op (memory only; see
// Recover).
func (k *Keeper) Held(op Owner) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dropStale(op)
	return k.held[op.Name] != nil
}

// dropStale forgets what the keeper knows of an earlier operation of op's
// name (deleted and created again). Called with mu held.
func (k *Keeper) dropStale(op Owner) {
	if k.uid[op.Name] == op.UID {
		return
	}
	delete(k.held, op.Name)
	delete(k.checked, op.Name)
	delete(k.next, op.Name)
	k.uid[op.Name] = op.UID
}

// Recover looks op's slot up on the server once per process: a watcher
// restarted while it held one finds it (and keeps renewing it) from the
// lease itself. It reports whether the keeper holds one.
func (k *Keeper) Recover(ctx context.Context, op Owner) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dropStale(op)
	if k.checked[op.Name] || k.held[op.Name] != nil {
		return k.held[op.Name] != nil, nil
	}
	l, err := k.sem.Find(ctx, op)
	if err != nil {
		return false, err
	}
	k.checked[op.Name] = true
	if l != nil {
		k.held[op.Name] = l
		k.log.Info("found the rollout slot this agent held", "operation", op.Name, "lease", l.Name)
	}
	return l != nil, nil
}

// Try makes an attempt to take a slot of op among slots, unless the last
// attempt was less than an interval ago. It reports whether a slot is
// held, and when not, how long until the next attempt is due. holders says
// which nodes may hold a slot of op (Semaphore.TryAcquire).
func (k *Keeper) Try(ctx context.Context, op Owner, slots int, holders func(string) bool) (bool, time.Duration, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dropStale(op)
	if k.held[op.Name] != nil {
		return true, 0, nil
	}
	now := time.Now()
	if due := k.next[op.Name]; now.Before(due) {
		return false, due.Sub(now), nil
	}
	// ±25 % jitter, so agents that started together drift apart.
	wait := time.Duration(float64(k.interval) * (0.75 + 0.5*rand.Float64()))
	k.next[op.Name] = now.Add(wait)
	l, err := k.sem.TryAcquire(ctx, op, slots, holders)
	if err != nil {
		return false, wait, err
	}
	k.checked[op.Name] = true
	if l == nil {
		return false, wait, nil
	}
	k.held[op.Name] = l
	k.log.Info("took a rollout slot", "operation", op.Name, "lease", l.Name, "slots", slots)
	return true, 0, nil
}

// Release gives op's slot back (after Recover, so a slot held before a
// restart is released too).
func (k *Keeper) Release(ctx context.Context, op Owner) error {
	if _, err := k.Recover(ctx, op); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.held[op.Name]
	if l == nil {
		return nil
	}
	if err := k.sem.Release(ctx, l.Name); err != nil {
		return err
	}
	delete(k.held, op.Name)
	delete(k.next, op.Name)
	k.log.Info("released the rollout slot", "operation", op.Name, "lease", l.Name)
	return nil
}

// Forget drops what the keeper knows of op (the operation is gone; its
// leases go with it through their owner reference).
func (k *Keeper) Forget(op string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.held, op)
	delete(k.checked, op)
	delete(k.next, op)
	delete(k.uid, op)
}

// Renew renews every slot held; a slot lost (taken over after this agent
// failed to renew within the duration) is dropped and logged.
func (k *Keeper) Renew(ctx context.Context) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for op, l := range k.held {
		rctx, cancel := context.WithTimeout(ctx, k.sem.Duration/3)
		out, err := k.sem.Renew(rctx, l)
		cancel()
		switch {
		case errors.Is(err, ErrLost):
			delete(k.held, op)
			k.log.Warn("lost the rollout slot: it was taken over or deleted", "operation", op, "err", err.Error())
			if k.OnLost != nil {
				k.OnLost(op, err.Error())
			}
		case err != nil:
			k.log.Warn("cannot renew the rollout slot; retrying", "operation", op, "lease", l.Name, "err", err.Error())
		default:
			k.held[op] = out
		}
	}
}

// Run renews the held slots every third of the lease duration until ctx
// ends.
func (k *Keeper) Run(ctx context.Context) {
	t := time.NewTicker(k.sem.Duration / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			k.Renew(ctx)
		}
	}
}
