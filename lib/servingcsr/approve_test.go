package servingcsr

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// apiserverEndpoints: the kubernetes Endpoints at 10.213.0.10 (the v1 API the approver falls back to where a cluster
// has no EndpointSlices).
func apiserverEndpoints() runtime.Object {
	//lint:ignore SA1019 the fallback under test reads the deprecated v1 Endpoints
	ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}}
	//lint:ignore SA1019 as above
	ep.Subsets = []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "10.213.0.10"}}}}
	return ep
}

// apiserverSlice: its EndpointSlice, at 10.213.0.11.
func apiserverSlice() runtime.Object {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default",
		Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.213.0.11"}}}}
}

// TestApprove: a pending request that passes is approved; the others stay
// pending with their reason and an Event; approved requests and other
// nodes' are left alone. The apiserver's addresses come from its
// EndpointSlices and the kubeconfig.
func TestApprove(t *testing.T) {
	good := request(t, "good", "system:node:w1", "system:node:w1", []string{"w1"}, []string{"10.213.1.2"})
	stolen := request(t, "stolen", "system:node:w1", "system:node:w1", nil, []string{"10.213.2.2"})
	slice := request(t, "slice", "system:node:w1", "system:node:w1", nil, []string{"10.213.0.11"})
	kcfg := request(t, "kcfg", "system:node:w1", "system:node:w1", nil, []string{"10.213.0.12"})
	w2 := request(t, "w2", "system:node:w2", "system:node:w2", []string{"w2"}, nil)
	cs := fake.NewClientset(apiserverSlice(), testNode("w1", "10.213.2.2", "10.213.0.11", "10.213.0.12"), testNode("w2"),
		good, stolen, slice, kcfg, w2)
	opts := Options{Policy: testPolicy(t), APIServerHosts: []string{"10.213.0.12"}}
	ds, err := Approve(t.Context(), cs, "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Decision{}
	for _, d := range ds {
		got[d.CSR] = d
	}
	want := map[string]string{"stolen": "another Node, w2",
		"slice": "EndpointSlice default/kubernetes", "kcfg": "the kubeconfig's server"}
	if len(ds) != 4 || !got["good"].Approved {
		t.Errorf("decisions %+v", ds)
	}
	for name, reason := range want {
		if got[name].Approved || !strings.Contains(got[name].Reason, reason) {
			t.Errorf("%s: %+v, want pending naming %q", name, got[name], reason)
		}
	}
	for name, wantPending := range map[string]bool{"good": false, "stolen": true, "w2": true} {
		c, err := cs.CertificatesV1().CertificateSigningRequests().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || pending(c) != wantPending {
			t.Errorf("%s: pending %v, want %v (%v)", name, pending(c), wantPending, err)
		}
	}
	evs, err := cs.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 3 {
		t.Errorf("%d events, want 3 (one per request left pending)", len(evs.Items))
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind != "CertificateSigningRequest" || e.Reason != EventReason || e.Type != corev1.EventTypeWarning {
			t.Errorf("event %+v", e)
		}
	}
	// Again: the same reasons add no Events.
	if _, err := Approve(t.Context(), cs, "w1", opts); err != nil {
		t.Fatal(err)
	}
	if evs, _ := cs.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{}); len(evs.Items) != 3 {
		t.Errorf("%d events after a second pass, want still 3", len(evs.Items))
	}
}

// TestApproveEndpoints: without EndpointSlices, the v1 Endpoints name the
// apiserver.
func TestApproveEndpoints(t *testing.T) {
	ep := request(t, "ep", "system:node:w1", "system:node:w1", nil, []string{"10.213.0.10"})
	cs := fake.NewClientset(apiserverEndpoints(), testNode("w1", "10.213.0.10"), ep)
	ds, err := Approve(t.Context(), cs, "", Options{Policy: testPolicy(t)})
	if err != nil || len(ds) != 1 || ds[0].Approved || !strings.Contains(ds[0].Reason, "Endpoints default/kubernetes") {
		t.Errorf("decisions %+v, err %v", ds, err)
	}
}

// TestApproveUnreadableEndpoints: when the apiserver's endpoints cannot be
// read, nothing is approved; when Events may not be created, the decision
// stands.
func TestApproveUnreadableEndpoints(t *testing.T) {
	good := request(t, "good", "system:node:w1", "system:node:w1", []string{"w1"}, []string{"10.213.1.2"})
	cs := fake.NewClientset(testNode("w1"), good)
	cs.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("no"))
	})
	if ds, err := Approve(t.Context(), cs, "", Options{Policy: testPolicy(t)}); err == nil || !strings.Contains(err.Error(), "EndpointSlices") || len(ds) != 0 {
		t.Errorf("decisions %+v, err %v: want an error and nothing decided", ds, err)
	}
	if c, _ := cs.CertificatesV1().CertificateSigningRequests().Get(t.Context(), "good", metav1.GetOptions{}); !pending(c) {
		t.Error("approved without reading the apiserver's endpoints")
	}

	bad := request(t, "bad", "system:node:w1", "system:node:w1", nil, []string{"192.0.2.1"})
	cs = fake.NewClientset(testNode("w1", "192.0.2.1"), bad)
	cs.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", errors.New("no"))
	})
	ds, err := Approve(t.Context(), cs, "", Options{Policy: testPolicy(t)})
	if err != nil || len(ds) != 1 || ds[0].Approved {
		t.Errorf("decisions %+v, err %v", ds, err)
	}
}

// TestWatch: a request filed while Watch runs is approved, one that breaks
// a rule stays pending, and Watch returns nil once its context is done.
func TestWatch(t *testing.T) {
	cs := fake.NewClientset(apiserverSlice(), testNode("w1", "10.96.0.1"), testNode("w2"))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, cs, Options{Policy: testPolicy(t), RequestTimeout: 5 * time.Second, Resync: time.Second})
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Watch did not return within 10s of its context ending")
		}
	}()
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	for _, c := range []*certv1.CertificateSigningRequest{
		request(t, "svc", "system:node:w1", "system:node:w1", nil, []string{"10.96.0.1"}),
		request(t, "good", "system:node:w1", "system:node:w1", []string{"w1"}, []string{"10.213.1.2"}),
	} {
		if _, err := csrs.Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := csrs.Get(ctx, "good", metav1.GetOptions{})
		if err == nil && !pending(c) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the good request was not approved within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The other was decided too: it has its Event.
	for {
		evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err == nil && len(evs.Items) > 0 {
			if !strings.Contains(evs.Items[0].Message, "Service CIDR") || evs.Items[0].InvolvedObject.Name != "svc" {
				t.Errorf("event %+v", evs.Items[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Event for the request left pending within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c, _ := csrs.Get(ctx, "svc", metav1.GetOptions{}); !pending(c) {
		t.Error("a request for the Service IP was approved")
	}
}

// TestDecideToldOnce: the watch logs a request's reason once, not at every
// resync; a new reason is logged again.
func TestDecideToldOnce(t *testing.T) {
	bad := request(t, "bad", "system:node:w1", "system:node:w1", nil, []string{"192.0.2.1"})
	cs := fake.NewClientset(testNode("w1", "192.0.2.1"), bad)
	var buf strings.Builder
	opts := Options{Policy: testPolicy(t), Log: slog.New(slog.NewTextHandler(&buf, nil))}
	told := map[string]string{}
	for range 3 {
		if _, err := decide(t.Context(), cs, bad, opts, told); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(buf.String(), "left pending"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, buf.String())
	}
	opts.Policy.NodeCIDRs = nil
	if _, err := decide(t.Context(), cs, bad, opts, told); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "left pending"); n != 2 {
		t.Errorf("a new reason logged %d times in all, want 2", n)
	}
}
