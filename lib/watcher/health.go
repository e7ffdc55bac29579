package watcher

// A rollout's health gate (spec.rollout.health): after its worker reports a
// NodeRestart or Repave of a rollout Succeeded, the watcher holds that
// result back until every pod on its own Node is Ready and every HTTP
// check answers 200, then publishes it; past the gate's timeout it turns
// the result into a failure with the reason, which counts against the
// failure budget. It reads only what this host sees (its Node's pods, the
// URLs from the host) and the operation's spec: nothing another node wrote.
// The verdict is written into the status file (requests.Status.Health), so
// a restarted watcher neither runs the gate twice nor loses its deadline,
// which counts from the worker's Succeeded.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// HealthGate runs one round of Action.Operation's health gate for
// Action.Status, a Succeeded result not published yet.
const HealthGate ActionType = "HealthGate"

// Bounds of one round of the gate: each request, and the pause between
// rounds.
const (
	healthCall = 10 * time.Second
	healthPoll = 5 * time.Second
)

// gated is the operation whose health gate s must pass before it is
// published (nil: none), among ops.
func gated(s *requests.Status, ops []v1alpha1.MachineOperation) *v1alpha1.MachineOperation {
	if s.Phase != requests.Succeeded || s.Health != "" || s.Operation == "" ||
		(s.Kind != requests.Repave && s.Kind != requests.Restart) {
		return nil
	}
	i := slices.IndexFunc(ops, func(op v1alpha1.MachineOperation) bool { return op.Name == s.Operation })
	if i < 0 || !paced(&ops[i]) || ops[i].Spec.Rollout.Health == nil {
		return nil
	}
	return &ops[i]
}

// healthTimeout is h's timeout.
func healthTimeout(h *v1alpha1.RolloutHealth) time.Duration {
	if h.TimeoutSeconds > 0 {
		return time.Duration(h.TimeoutSeconds) * time.Second
	}
	return v1alpha1.DefaultHealthTimeout * time.Second
}

// healthGate carries out HealthGate: one round of checks; the verdict goes
// into the status file (the next decision publishes it), a wait into the
// operation entry's message.
func (l *loop) healthGate(ctx context.Context, in Inputs, a Action) error {
	h := a.Operation.Spec.Rollout.Health
	timeout := healthTimeout(h)
	// Every event brings a decision; a round runs at most once per poll.
	if last, ok := l.healthAt[a.Status.RequestID]; ok && time.Since(last) < healthPoll {
		l.nudgeIn(healthPoll - time.Since(last))
		return nil
	}
	l.healthAt[a.Status.RequestID] = time.Now()
	why := l.unhealthy(ctx, h)
	s := *a.Status
	if why == "" || time.Since(s.UpdatedAt) >= timeout {
		delete(l.healthAt, s.RequestID)
	}
	switch {
	case why == "":
		s.Health, s.Message = requests.HealthPassed, s.Message+"; health gate passed"
		l.Log.Info("health gate passed", "operation", s.Operation, "request", s.RequestID)
		return l.dir.WriteStatus(&s)
	case time.Since(s.UpdatedAt) >= timeout:
		s.Phase, s.Health = requests.Failed, requests.HealthFailed
		s.Message = fmt.Sprintf("health gate not passed within %s: %s (the %s itself succeeded: %s)", timeout, why, s.Kind, s.Message)
		l.Log.Warn("health gate failed", "operation", s.Operation, "request", s.RequestID, "why", why)
		return l.dir.WriteStatus(&s)
	}
	l.nudgeIn(min(healthPoll, time.Until(s.UpdatedAt.Add(timeout))+time.Millisecond))
	wait := s
	wait.Phase, wait.Message = requests.InProgress, "health gate: "+why
	return l.publishOperation(ctx, in, &wait)
}

// unhealthy is why the gate does not pass now ("" when it does): the pods
// on this node that are not Ready, then the checks that do not answer 200.
func (l *loop) unhealthy(ctx context.Context, h *v1alpha1.RolloutHealth) string {
	var why []string
	if msg := l.podsNotReady(ctx); msg != "" {
		why = append(why, msg)
	}
	for _, c := range h.HTTPChecks {
		if msg := httpCheck(ctx, string(c.URL)); msg != "" {
			why = append(why, msg)
		}
	}
	return strings.Join(why, "; ")
}

// podsNotReady lists the pods bound to this node (the only pods a node
// identity may list) and names those running but not Ready.
func (l *loop) podsNotReady(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, healthCall)
	defer cancel()
	var pods corePodList
	err := l.core.Get().Resource("pods").Param("fieldSelector", "spec.nodeName="+l.NodeName).Do(cctx).Into(&pods)
	if err != nil {
		return "cannot list the pods on node " + l.NodeName + ": " + err.Error()
	}
	var bad []string
	for _, p := range pods.Items {
		if p.Status.Phase == "Succeeded" || p.Status.Phase == "Failed" {
			continue // finished: never Ready again, and not meant to be
		}
		if !slices.ContainsFunc(p.Status.Conditions, func(c corePodCondition) bool { return c.Type == "Ready" && c.Status == "True" }) {
			bad = append(bad, p.Namespace+"/"+p.Name)
		}
	}
	if len(bad) == 0 {
		return ""
	}
	slices.Sort(bad)
	if len(bad) > 5 {
		bad = append(bad[:5], fmt.Sprintf("and %d more", len(bad)-5))
	}
	return fmt.Sprintf("pods on node %s not Ready: %s", l.NodeName, strings.Join(bad, ", "))
}

// httpCheck gets u and says what is wrong ("" for a 200). The message
// names the URL without its query, which may hold a token.
func httpCheck(ctx context.Context, u string) string {
	shown := u
	if p, err := url.Parse(u); err == nil {
		p.RawQuery, p.User = "", nil
		shown = p.String()
	}
	cctx, cancel := context.WithTimeout(ctx, healthCall)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, u, nil)
	if err != nil {
		return "check " + shown + ": " + err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "check " + shown + ": " + strings.ReplaceAll(err.Error(), u, shown)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("check %s answered %s, want 200", shown, resp.Status)
	}
	return ""
}
