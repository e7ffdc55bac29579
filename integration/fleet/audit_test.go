package fleet

import (
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/kube"
)

type fakeAudit []kube.AuditEvent

func (f fakeAudit) AuditEvents(keep func(kube.AuditEvent) bool) ([]kube.AuditEvent, error) {
	var out []kube.AuditEvent
	for _, e := range f {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out, nil
}

func ev(id, stage, verb, user, ua, resource string, received, at time.Time) kube.AuditEvent {
	e := kube.AuditEvent{AuditID: id, Stage: stage, Verb: verb, UserAgent: ua, Received: received, At: at}
	e.User.Username = user
	e.ObjectRef = &struct {
		Resource string `json:"resource"`
		Name     string `json:"name"`
	}{Resource: resource}
	return e
}

func TestCountIdle(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	from, to := t0.Add(time.Minute), t0.Add(2*time.Minute)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	const me, ua = "system:node:n1", "kubeslot-watcher"
	log := fakeAudit{
		// A watch opened before the window and still open: counted as open at the end only.
		ev("w1", "RequestReceived", "watch", me, ua, "machines", at(10), at(10)),
		// A watch that ends in the window after 5 minutes... opened long before.
		ev("w0", "RequestReceived", "watch", me, ua, "nodes", at(-240), at(-240)),
		ev("w0", "ResponseComplete", "watch", me, ua, "nodes", at(-240), at(70)),
		// Its successor, opened in the window.
		ev("w2", "RequestReceived", "watch", me, ua, "nodes", at(70), at(70)),
		// A request besides watches in the window.
		ev("g1", "RequestReceived", "get", me, ua, "machines", at(90), at(90)),
		ev("g1", "ResponseComplete", "get", me, ua, "machines", at(90), at(90)),
		// Not the agent: the node's kubelet (same user), another node's watcher, and a request after the window.
		ev("k1", "RequestReceived", "get", me, "kubelet/v1.37.2 (linux/amd64)", "nodes", at(80), at(80)),
		ev("o1", "RequestReceived", "get", "system:node:n2", ua, "machines", at(80), at(80)),
		ev("g2", "RequestReceived", "get", me, ua, "machines", at(130), at(130)),
	}
	idle, err := CountIdle(log, from, to, AgentUser("", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if idle.Others != 1 || idle.WatchesOpened != 1 || idle.Requests["get machines"] != 1 || idle.Requests["watch nodes"] != 1 {
		t.Errorf("counts: %+v", idle)
	}
	if len(idle.WatchesEnded) != 1 || idle.WatchesEnded[0] != 310*time.Second {
		t.Errorf("watches ended: %v", idle.WatchesEnded)
	}
	if len(idle.OpenAtEnd) != 2 || idle.OpenAtEnd[0] != 50*time.Second || idle.OpenAtEnd[1] != 110*time.Second {
		t.Errorf("open at the end: %v", idle.OpenAtEnd)
	}
	if s := idle.String(); !strings.Contains(s, "1 requests besides watches") || !strings.Contains(s, "2 open at its end") {
		t.Errorf("String: %s", s)
	}
	// A prefix selects a fleet's nodes.
	fl, _ := CountIdle(log, from, to, AgentUser("n"))
	if fl.Others != 2 {
		t.Errorf("prefix: %+v", fl)
	}
}
