package servingcsr

import (
	"context"
	"fmt"
	"slices"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Watch is the long-running approver: it watches kubelet serving requests
// and decides each pending one as it comes (a new node, a rotation, a
// request after an address change), and looks again at a node's pending
// requests when its Node's addresses change and at all of them every
// opts.Resync. Each decision is bounded by opts.RequestTimeout; a request
// whose decision failed is retried with backoff. Watch returns nil when
// ctx is done, after its worker finished the request at hand.
func Watch(ctx context.Context, cs kubernetes.Interface, opts Options) error {
	opts.defaults()
	csrs := informers.NewSharedInformerFactoryWithOptions(cs, opts.Resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", Signer).String()
	}))
	nodes := informers.NewSharedInformerFactory(cs, 0)
	csrInf := csrs.Certificates().V1().CertificateSigningRequests()
	nodeInf := nodes.Core().V1().Nodes()

	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "kubelet-serving-csrs"})
	defer q.ShutDown()
	enqueue := func(obj any) {
		if csr, ok := obj.(*certv1.CertificateSigningRequest); ok && pending(csr) {
			q.Add(csr.Name)
		}
	}
	if _, err := csrInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return fmt.Errorf("watch certificate signing requests: %w", err)
	}
	csrLister := csrInf.Lister()
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, obj any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := obj.(*corev1.Node)
			if !ok1 || !ok2 || slices.Equal(o.Status.Addresses, n.Status.Addresses) {
				return
			}
			all, err := csrLister.List(labels.Everything())
			if err != nil {
				return
			}
			for _, csr := range all {
				if NodeOf(csr) == n.Name {
					enqueue(csr)
				}
			}
		},
	}); err != nil {
		return fmt.Errorf("watch Nodes: %w", err)
	}

	csrs.Start(ctx.Done())
	nodes.Start(ctx.Done())
	defer csrs.Shutdown()
	defer nodes.Shutdown()
	for typ, ok := range csrs.WaitForCacheSync(ctx.Done()) {
		if !ok && ctx.Err() == nil {
			return fmt.Errorf("watch: the %v cache did not sync", typ)
		}
	}
	nodes.WaitForCacheSync(ctx.Done())
	if ctx.Err() != nil {
		return nil
	}
	opts.Log.Info("watching kubelet serving requests", "nodeCIDRs", joinPrefixes(opts.Policy.NodeCIDRs),
		"serviceCIDRs", joinPrefixes(opts.Policy.ServiceCIDRs), "dnsSuffixes", opts.Policy.DNSSuffixes,
		"clusterDomain", opts.Policy.ClusterDomain)
	if len(opts.Policy.NodeCIDRs) == 0 {
		opts.Log.Warn("no --node-cidrs: no IP address is ever approved")
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		told := map[string]string{} // the worker's own: one goroutine
		for work(ctx, cs, q, csrLister.Get, opts, told) {
		}
	}()
	<-ctx.Done()
	q.ShutDown()
	<-done
	opts.Log.Info("stopped watching kubelet serving requests")
	return nil
}

// work decides one queued request; false once the queue is shut down.
func work(ctx context.Context, cs kubernetes.Interface, q workqueue.TypedRateLimitingInterface[string],
	get func(string) (*certv1.CertificateSigningRequest, error), opts Options, told map[string]string) bool {
	name, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(name)
	csr, err := get(name)
	if err != nil || !pending(csr) {
		delete(told, name)
		q.Forget(name)
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, opts.RequestTimeout)
	defer cancel()
	if _, err := decide(rctx, cs, csr, opts, told); err != nil {
		if ctx.Err() != nil {
			return true
		}
		opts.Log.Warn("kubelet serving request not decided; retrying", "csr", name, "err", err)
		q.AddRateLimited(name)
		return true
	}
	q.Forget(name)
	return true
}
