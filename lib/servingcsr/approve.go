package servingcsr

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Options configure Approve and Watch.
type Options struct {
	Policy Policy
	// APIServerHosts are hosts the apiserver is known by besides its
	// endpoints: the host of the kubeconfig's server URL.
	APIServerHosts []string
	Log            *slog.Logger
	// RequestTimeout bounds Watch's handling of one request (default 30s).
	RequestTimeout time.Duration
	// Resync is how often Watch looks at every pending request again, so
	// one refused for an address the Node did not report yet is approved
	// once it does (default 1m).
	Resync time.Duration
}

func (o *Options) defaults() {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.Resync <= 0 {
		o.Resync = time.Minute
	}
}

// Decision is what the approver did with one pending request.
type Decision struct {
	CSR, Node string
	Approved  bool
	// Reason is why it was left pending (not approved).
	Reason string
}

// EventReason is the reason of the Event a request left pending gets.
const EventReason = "KubeslotServingPending"

// eventNamespace is where Events about cluster-scoped objects go.
const eventNamespace = metav1.NamespaceDefault

// Approve looks at every pending kubelet serving request (of node only,
// when node is not "") and approves those Check accepts; the others stay
// pending for a person, with the reason in the result, the log and an
// Event. Nothing is denied. It reads the Nodes and the apiserver's
// endpoints afresh for each request, and approves nothing when it cannot.
func Approve(ctx context.Context, cs kubernetes.Interface, node string, opts Options) ([]Decision, error) {
	opts.defaults()
	list, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + Signer})
	if err != nil {
		return nil, fmt.Errorf("list certificate signing requests: %w", err)
	}
	var todo []*certv1.CertificateSigningRequest
	for i := range list.Items {
		csr := &list.Items[i]
		if pending(csr) && (node == "" || NodeOf(csr) == node) {
			todo = append(todo, csr)
		}
	}
	if len(todo) == 0 {
		return nil, nil
	}
	var out []Decision
	for _, csr := range todo {
		d, err := decide(ctx, cs, csr, opts, nil)
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

// decide reads the cluster, checks csr against it and approves it or
// records why not. An error means nothing was decided. told, when not nil,
// holds the reason each request was last left pending for: the same
// reason again is logged at debug level only, so a watch's resyncs do not
// repeat it.
func decide(ctx context.Context, cs kubernetes.Interface, csr *certv1.CertificateSigningRequest, opts Options, told map[string]string) (Decision, error) {
	n := NodeOf(csr)
	d := Decision{CSR: csr.Name, Node: n}
	// Read afresh for every request: a Node that registered a moment ago
	// must already count as another node.
	nodes, cl, err := readCluster(ctx, cs, n, opts.APIServerHosts)
	if err != nil {
		return d, err
	}
	if err := Check(csr, nodes[n], opts.Policy, cl); err != nil {
		d.Reason = err.Error()
		if r, ok := told[csr.Name]; ok && r == d.Reason {
			opts.Log.Debug("kubelet serving request still pending", "csr", csr.Name, "node", n)
			return d, nil
		}
		if told != nil {
			told[csr.Name] = d.Reason
		}
		opts.Log.Warn("kubelet serving request left pending", "csr", csr.Name, "node", n, "reason", d.Reason)
		recordPending(ctx, cs, csr, d.Reason, opts.Log)
		return d, nil
	}
	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "KubeslotServingApproved",
		Message: "the node asked for itself, for its own addresses inside the operator's node CIDRs (kubeslot cluster approve-serving)",
	})
	if _, err := cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		return d, fmt.Errorf("approve %s: %w", csr.Name, err)
	}
	d.Approved = true
	delete(told, csr.Name)
	opts.Log.Info("kubelet serving request approved", "csr", csr.Name, "node", n)
	return d, nil
}

// readCluster returns the Nodes by name and what Check must know about
// everything but node self.
func readCluster(ctx context.Context, cs kubernetes.Interface, self string, hosts []string) (map[string]*corev1.Node, Cluster, error) {
	cl := Cluster{Others: map[string]string{}, APIServer: map[string]string{}}
	nl, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, cl, fmt.Errorf("list Nodes: %w", err)
	}
	nodes := map[string]*corev1.Node{}
	for i := range nl.Items {
		n := &nl.Items[i]
		nodes[n.Name] = n
		if n.Name == self {
			continue
		}
		cl.Others[normName(n.Name)] = n.Name
		for _, a := range n.Status.Addresses {
			cl.Others[addrKey(a.Address)] = n.Name
		}
	}
	sl, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		return nil, cl, fmt.Errorf("list EndpointSlices default (service kubernetes): %w", err)
	}
	for _, s := range sl.Items {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				cl.APIServer[addrKey(a)] = "EndpointSlice default/" + s.Name
			}
		}
	}
	// The v1 Endpoints only where there are no slices (deprecated: reading
	// it draws a warning on every request).
	if len(sl.Items) == 0 {
		ep, err := cs.CoreV1().Endpoints(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, cl, fmt.Errorf("get Endpoints default/kubernetes: %w", err)
		default:
			for _, s := range ep.Subsets {
				for _, a := range append(s.Addresses, s.NotReadyAddresses...) {
					cl.APIServer[addrKey(a.IP)] = "Endpoints default/kubernetes"
					if a.Hostname != "" {
						cl.APIServer[addrKey(a.Hostname)] = "Endpoints default/kubernetes"
					}
				}
			}
		}
	}
	for _, h := range hosts {
		if h != "" {
			cl.APIServer[addrKey(h)] = "the kubeconfig's server"
		}
	}
	return nodes, cl, nil
}

// addrKey is an address as Cluster's maps hold it.
func addrKey(s string) string {
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap().String()
	}
	return normName(s)
}

// recordPending records reason as a Warning Event on csr, once per
// request and reason (its name is derived from both, so the watch's
// resyncs do not pile up copies). Without permission to create Events it
// only logs.
func recordPending(ctx context.Context, cs kubernetes.Interface, csr *certv1.CertificateSigningRequest, reason string, log *slog.Logger) {
	sum := sha256.Sum256([]byte(reason))
	msg := reason
	if len(msg) > 1000 {
		msg = msg[:1000] + "…"
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: csr.Name + "." + hex.EncodeToString(sum[:8]), Namespace: eventNamespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: certv1.SchemeGroupVersion.String(), Kind: "CertificateSigningRequest",
			Name: csr.Name, UID: csr.UID, ResourceVersion: csr.ResourceVersion},
		Reason: EventReason, Message: msg, Type: corev1.EventTypeWarning, Count: 1,
		FirstTimestamp: now, LastTimestamp: now,
		Source: corev1.EventSource{Component: "kubeslot-approve-serving"},
	}
	_, err := cs.CoreV1().Events(eventNamespace).Create(ctx, ev, metav1.CreateOptions{})
	switch {
	case err == nil, apierrors.IsAlreadyExists(err):
	case apierrors.IsForbidden(err):
		log.Debug("not allowed to record an Event on the request", "csr", csr.Name)
	default:
		log.Warn("record an Event on the request", "csr", csr.Name, "err", err)
	}
}
