package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/machineclient"
	"github.com/kubeslot/kubeslot/lib/metrics"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/rollout"
	"github.com/kubeslot/kubeslot/lib/state"
)

// Options configure Run.
type Options struct {
	Root         *hostroot.Root
	REST         *rest.Config
	NodeName     string
	MachineName  string
	AgentVersion string
	Log          *slog.Logger
	// Synced is called once, after the watches listed for the first time.
	Synced func()
	// CallTimeout bounds each API write (default 20 s).
	CallTimeout time.Duration
	// Started is when this watcher process started (default: when Run was
	// called). UpgradeProbation is how long it must have been up before a
	// release upgraded to and reported Succeeded leaves its probation and
	// becomes last-good (default 30 s): a new release that fails sooner is
	// rolled back by the recovery unit, and that is reported.
	Started          time.Time
	UpgradeProbation time.Duration
	// HooksErr is why the active slot's lifecycle hooks could not be
	// ensured at start; it is reported as Degraded ("" when they were).
	HooksErr string
	// BetweenReads, test hook only, runs inside each read of the applied
	// state, between its two files (state.Store.SetBetweenReads).
	BetweenReads func()
	// ReleaseStartup (the binary, not in-process fleets) pages the binary's
	// start-up code out of memory once, after the first sync (pages.go).
	ReleaseStartup bool
	// RolloutLease is the duration of the rollout slots this agent takes
	// (renewed every third of it), RolloutPoll how often it tries for one
	// while waiting (lib/rollout defaults: 60 s, 10 s).
	RolloutLease, RolloutPoll time.Duration
	// Metrics records what the loop publishes and finds in status/ (nil:
	// nothing recorded, as in the in-process fleets).
	Metrics *metrics.Watcher
}

// DefaultUpgradeProbation is Options.UpgradeProbation's default: how long
// an upgraded watcher must have been up before its release leaves probation.
const DefaultUpgradeProbation = 30 * time.Second

// loop is one run of the watcher.
type loop struct {
	Options
	mc      *machineclient.Client
	core    rest.Interface // Nodes and Events
	dir     *requests.Dir
	store   *state.Store
	machine cache.Store
	node    cache.Store
	ops     cache.Store
	stops   cache.Store
	// stopsSynced is the RolloutStop watch's; it is not in synced (below).
	stopsSynced cache.InformerSynced
	synced      []cache.InformerSynced
	kick        chan struct{}
	// published caches the marker between decisions.
	published requests.Published
	lastPrune time.Time
	// probationTimer decides again once the process has been up for its
	// probation window, so that it ends without waiting for another event.
	probationTimer *time.Timer
	// ttl arms the deletes of finished operations (ttl.go).
	ttl ttlState
	// failures counts the passes in a row with a failed action (the retry
	// backs off with it); reported holds each failing action's last error,
	// logged once until it changes or the action succeeds.
	failures int
	reported map[string]string
	// lastAddrErr is the post-start address check's last finding (logged
	// when it changes).
	lastAddrErr string
	// slots holds this agent's rollout slots; slotTimer decides again
	// when the next attempt for one is due (rollout.go).
	slots     *rollout.Keeper
	slotTimer *time.Timer
	slotDue   time.Time
	// rolloutPoll is the slots' poll interval; targets are the rollout
	// operations' targets as last Listed (targets.go); waitWrites the
	// backoff of each operation's Waiting write, by UID (rollout.go).
	rolloutPoll time.Duration
	targets     *targetBook
	waitWrites  map[types.UID]*waitWrite
	// healthAt is when each gated request's last health round ran
	// (health.go).
	healthAt map[string]time.Time
}

// statusRetention is how long published results stay in status/ (the newest
// of each kind stays regardless; see requests.Prune).
const statusRetention = 7 * 24 * time.Hour

// Run watches this host's Machine, its operations and its Node, and the
// status directory, and acts on Decide's answers until ctx ends. Watch
// errors (the cluster unreachable, 410 Gone) are handled by the informers,
// which relist with backoff; Run returns only when ctx ends or the host root
// cannot be watched.
func Run(ctx context.Context, o Options) error {
	if o.CallTimeout <= 0 {
		o.CallTimeout = 20 * time.Second
	}
	if o.UpgradeProbation <= 0 {
		o.UpgradeProbation = DefaultUpgradeProbation
	}
	if o.Started.IsZero() {
		o.Started = time.Now()
	}
	mc, err := machineclient.New(o.REST)
	if err != nil {
		return err
	}
	core, err := newCoreClient(o.REST)
	if err != nil {
		return err
	}
	poll := o.RolloutPoll
	if poll <= 0 {
		poll = rollout.DefaultInterval
	}
	l := &loop{Options: o, mc: mc, core: core, dir: requests.New(o.Root), store: state.NewStore(o.Root), kick: make(chan struct{}, 1),
		slots:       rollout.NewKeeper(rollout.REST{Client: mc.REST()}, o.NodeName, o.RolloutLease, poll, o.Log),
		rolloutPoll: poll, targets: newTargetBook(poll), waitWrites: map[types.UID]*waitWrite{},
		healthAt: map[string]time.Time{}}
	l.slots.OnLost = l.slotLost
	if o.BetweenReads != nil {
		l.store.SetBetweenReads(o.BetweenReads)
	}
	defer func() {
		if l.probationTimer != nil {
			l.probationTimer.Stop()
		}
		l.ttl.stop()
		if l.slotTimer != nil {
			l.slotTimer.Stop()
		}
	}()
	go l.slots.Run(ctx)
	if l.published, err = l.dir.LoadPublished(); err != nil {
		return err
	}
	fw, err := l.watchFiles()
	if err != nil {
		return err
	}
	defer fw.Close()

	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.nudge() },
		UpdateFunc: func(any, any) { l.nudge() },
		DeleteFunc: func(any) { l.nudge() },
	}
	informer := func(lw cache.ListerWatcher, obj runtime.Object) (cache.Store, cache.Controller) {
		return cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: lw, ObjectType: obj, Handler: handler,
			Transform: dropManagedFields})
	}
	var ctrls []cache.Controller
	add := func(s cache.Store, c cache.Controller) cache.Store {
		ctrls = append(ctrls, c)
		l.synced = append(l.synced, c.HasSynced)
		return s
	}
	byName := func(name string) fields.Selector { return fields.OneTermEqualSelector("metadata.name", name) }
	l.machine = add(informer(cache.NewListWatchFromClient(mc.REST(), v1alpha1.MachinesResource, "", byName(o.MachineName)), &v1alpha1.Machine{}))
	l.node = add(informer(cache.NewListWatchFromClient(core, "nodes", "", byName(o.NodeName)), &coreNode{}))
	// Operations target a Machine by reference or by label selector, which
	// the server cannot filter: they are watched cluster-wide, and Decide
	// keeps only the operations that target this Machine.
	l.ops = add(informer(cache.NewListWatchFromClient(mc.REST(), v1alpha1.MachineOperationsResource, "", fields.Everything()), &v1alpha1.MachineOperation{}))
	// The emergency stop: a handful of objects at most, written by admins
	// alone, so a watch costs nothing while the fleet is idle. Not waited
	// for: a cluster installed before RolloutStops existed must not keep
	// the watcher from everything else; until it has listed, every rollout
	// counts as stopped (stopMessage).
	var stopsCtrl cache.Controller
	l.stops, stopsCtrl = informer(cache.NewListWatchFromClient(mc.REST(), v1alpha1.RolloutStopsResource, "", fields.Everything()), &v1alpha1.RolloutStop{})
	ctrls = append(ctrls, stopsCtrl)
	l.stopsSynced = stopsCtrl.HasSynced
	for _, c := range ctrls {
		go c.Run(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), l.synced...) {
		return ctx.Err()
	}
	o.Log.Info("watches synced", "machine", o.MachineName, "node", o.NodeName)
	go func() {
		// An empty list brings no event: decide again once it is read.
		if cache.WaitForCacheSync(ctx.Done(), l.stopsSynced) {
			l.nudge()
		}
	}()
	if o.Synced != nil {
		o.Synced()
	}
	if o.ReleaseStartup {
		release := time.AfterFunc(releaseAfter, func() { releaseStartupPages(o.Log) })
		defer release.Stop()
	}
	l.nudge()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-fw.Events:
			if !ok {
				return errors.New("status watch closed")
			}
			l.nudge()
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("status watch closed")
			}
			o.Log.Warn("status watch error; re-reading everything", "err", err.Error())
			l.nudge()
		case <-l.kick:
			// Let a burst of events settle into one decision.
			time.Sleep(20 * time.Millisecond)
			drain(l.kick)
			l.once(ctx)
		}
	}
}

func drain(c chan struct{}) {
	select {
	case <-c:
	default:
	}
}

func (l *loop) nudge() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// watchFiles watches the directories whose files feed Decide.
func (l *loop) watchFiles() (*fsnotify.Watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch status files: %w", err)
	}
	for _, name := range []string{hostroot.StatusDir, hostroot.RequestsDir, hostroot.StateDir, hostroot.AppliedDir} {
		p, err := l.Root.Path(name)
		if err == nil {
			err = mkdir(p)
		}
		if err == nil {
			err = fw.Add(p)
		}
		if err != nil {
			fw.Close()
			return nil, fmt.Errorf("watch %s: %w", name, err)
		}
	}
	return fw, nil
}
