package fleet

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/integration/kube"
)

// Idle is what agents asked of the apiserver in an idle window, read from its audit log (kube.ControlPlane.AuditLog):
// counted at the apiserver, per client (user and user agent), so nothing else the apiserver serves is mixed in.
type Idle struct {
	Window time.Duration
	// Requests counts the requests received in the window by "verb resource", watches included.
	Requests map[string]int
	// Others is the number of requests in the window that are not watches: the target is 0.
	Others int
	// WatchesOpened is the number of watches opened in the window (a reflector re-opens its watch when the
	// server-side timeout, 5–10 minutes, ends the previous one).
	WatchesOpened int
	// WatchesEnded is how long each watch that ended in the window had been open.
	WatchesEnded []time.Duration
	// OpenAtEnd is how long each watch still open at the end of the window had been open by then.
	OpenAtEnd []time.Duration
}

// Auditor is what CountIdle needs of the control plane (kube.ControlPlane has it).
type Auditor interface {
	AuditEvents(keep func(kube.AuditEvent) bool) ([]kube.AuditEvent, error)
}

// AgentUser selects the requests of the watchers named in names (or, with prefix, every node whose name starts with
// it): user system:node:<name> and the watcher's user agent. The kubelet of the same node has the same user and
// another user agent.
func AgentUser(prefix string, names ...string) func(kube.AuditEvent) bool {
	want := map[string]bool{}
	for _, n := range names {
		want["system:node:"+n] = true
	}
	return func(e kube.AuditEvent) bool {
		if !strings.HasPrefix(e.UserAgent, "kubeslot-watcher") {
			return false
		}
		u := e.User.Username
		return want[u] || (prefix != "" && strings.HasPrefix(u, "system:node:"+prefix))
	}
}

// CountIdle counts the requests match selects that the apiserver received in [from, to), and the watches that ended
// in it or were still open at its end.
func CountIdle(a Auditor, from, to time.Time, match func(kube.AuditEvent) bool) (Idle, error) {
	evs, err := a.AuditEvents(match)
	if err != nil {
		return Idle{}, err
	}
	idle := Idle{Window: to.Sub(from), Requests: map[string]int{}}
	in := func(t time.Time) bool { return !t.Before(from) && t.Before(to) }
	open := map[string]time.Time{} // watches by audit ID, received before to and not ended before to
	for _, e := range evs {
		switch e.Stage {
		case "RequestReceived":
			if e.Verb == "watch" && e.Received.Before(to) {
				open[e.AuditID] = e.Received
			}
			if !in(e.Received) {
				continue
			}
			idle.Requests[e.Verb+" "+e.Resource()]++
			if e.Verb == "watch" {
				idle.WatchesOpened++
			} else {
				idle.Others++
			}
		case "ResponseComplete", "Panic":
			if e.Verb != "watch" || e.At.After(to) {
				continue
			}
			delete(open, e.AuditID)
			if in(e.At) {
				idle.WatchesEnded = append(idle.WatchesEnded, e.At.Sub(e.Received).Round(time.Second))
			}
		}
	}
	for _, since := range open {
		idle.OpenAtEnd = append(idle.OpenAtEnd, to.Sub(since).Round(time.Second))
	}
	slices.Sort(idle.WatchesEnded)
	slices.Sort(idle.OpenAtEnd)
	return idle, nil
}

// PerMinute scales a count over the window to one minute.
func (i Idle) PerMinute(n int) float64 { return float64(n) / i.Window.Minutes() }

// String is one paragraph for a test log.
func (i Idle) String() string {
	kinds := slices.Collect(maps.Keys(i.Requests))
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Or(cmp.Compare(i.Requests[b], i.Requests[a]), cmp.Compare(a, b)) })
	var ks []string
	for _, k := range kinds {
		ks = append(ks, fmt.Sprintf("%d %s", i.Requests[k], k))
	}
	if len(ks) == 0 {
		ks = []string{"none"}
	}
	ended := "none ended"
	if len(i.WatchesEnded) > 0 {
		ended = fmt.Sprintf("%d ended, after %s to %s open", len(i.WatchesEnded), i.WatchesEnded[0], i.WatchesEnded[len(i.WatchesEnded)-1])
	}
	open := "none open at its end"
	if len(i.OpenAtEnd) > 0 {
		open = fmt.Sprintf("%d open at its end, for %s to %s", len(i.OpenAtEnd), i.OpenAtEnd[0], i.OpenAtEnd[len(i.OpenAtEnd)-1])
	}
	return fmt.Sprintf("in %s at the apiserver (audit log): %d requests besides watches, %d watches opened (by kind: %s); "+
		"watches: %s, %s", i.Window.Round(time.Second), i.Others, i.WatchesOpened, strings.Join(ks, ", "), ended, open)
}
