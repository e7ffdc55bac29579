// Package clusterinstall puts kubeslot's cluster API into a cluster and
// takes it out again: the CustomResourceDefinitions, the agents' RBAC and the
// admission policies embedded in lib/api/v1alpha1, and enrolls Machines in
// the fleet. It is the logic of `kubeslot cluster
// install|uninstall|enroll|manifests` (the last prints the same objects for
// kubectl apply -k and GitOps tools), and the test rig calls it too.
// Imported by cmd/kubeslot only.
//
// Install is idempotent: it applies every object with server-side apply
// under the field manager "kubeslot" and reports, per object, whether it was
// created, updated or left unchanged (the resourceVersion did not move).
package clusterinstall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// FieldManager owns, for server-side apply, every field kubeslot installs.
const FieldManager = "kubeslot"

// Bounds of the waits. Every wait also ends with the caller's context.
const (
	// EstablishTimeout bounds the wait for the apiserver to serve the CRDs.
	EstablishTimeout = time.Minute
	// EnforceTimeout bounds the wait for the admission policy to be in
	// force (see waitEnforced).
	EnforceTimeout = 30 * time.Second
	// RemoveTimeout bounds the wait for deleted CRDs to be gone.
	RemoveTimeout = 2 * time.Minute
	pollInterval  = 200 * time.Millisecond
)

// Action is what happened to one object.
type Action string

const (
	Created   Action = "created"
	Updated   Action = "updated"
	Unchanged Action = "unchanged"
	Deleted   Action = "deleted"
	Absent    Action = "absent" // uninstall found nothing to delete
)

// Change is what happened to one object.
type Change struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Action Action `json:"action"`
}

// Report lists what Install or Uninstall did, in order.
type Report struct {
	Changes []Change `json:"changes"`
}

// Changed reports whether any object was created, updated or deleted.
func (r Report) Changed() bool {
	for _, c := range r.Changes {
		if c.Action != Unchanged && c.Action != Absent {
			return true
		}
	}
	return false
}

// Print writes one line per object, in kubectl's style:
// "customresourcedefinition/machines.kubeslot.dev created".
func (r Report) Print(w io.Writer) error {
	for _, c := range r.Changes {
		if _, err := fmt.Fprintf(w, "%s/%s %s\n", strings.ToLower(c.Kind), c.Name, c.Action); err != nil {
			return err
		}
	}
	return nil
}

// resources maps the kinds of the embedded manifests to their (cluster-
// scoped) resources, so no discovery round trip is needed.
var resources = map[schema.GroupVersionKind]string{
	{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}:                 "customresourcedefinitions",
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}:                         "clusterroles",
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"}:                  "clusterrolebindings",
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingAdmissionPolicy"}:        "validatingadmissionpolicies",
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingAdmissionPolicyBinding"}: "validatingadmissionpolicybindings",
}

func resourceFor(dc dynamic.Interface, obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	res, ok := resources[gvk]
	if !ok {
		return nil, fmt.Errorf("manifest %s %s: kind not known to the installer", gvk, obj.GetName())
	}
	return dc.Resource(gvk.GroupVersion().WithResource(res)), nil
}

// manifests returns the CRDs and the access control, in apply order.
func manifests() (crds, access []*unstructured.Unstructured, err error) {
	if crds, err = v1alpha1.CRDs(); err != nil {
		return nil, nil, err
	}
	if access, err = v1alpha1.AccessControl(); err != nil {
		return nil, nil, err
	}
	return crds, access, nil
}

// Install refuses an apiserver older than MinKubernetesVersion, applies the
// CRDs, waits until the apiserver serves them, then applies the access
// control (admission policies before the RBAC that grants agents anything)
// and waits until the policy is in force. Running it again changes nothing
// and reports every object Unchanged.
func Install(ctx context.Context, cfg *rest.Config, log *slog.Logger) (Report, error) {
	var rep Report
	crds, access, err := manifests()
	if err != nil {
		return rep, err
	}
	sv, err := versionClientFor(cfg)
	if err != nil {
		return rep, err
	}
	if err := checkVersion(ctx, sv); err != nil {
		return rep, err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return rep, fmt.Errorf("cluster client: %w", err)
	}
	t0 := time.Now()
	for _, obj := range crds {
		c, err := apply(ctx, dc, obj)
		if err != nil {
			return rep, err
		}
		rep.Changes = append(rep.Changes, c)
		log.Debug("applied", "kind", c.Kind, "name", c.Name, "action", c.Action)
	}
	for _, obj := range crds {
		if err := waitEstablished(ctx, dc, obj.GetName()); err != nil {
			return rep, err
		}
	}
	log.Debug("CRDs established", "took", time.Since(t0).Round(time.Millisecond))
	for _, obj := range access {
		c, err := apply(ctx, dc, obj)
		if err != nil {
			return rep, err
		}
		rep.Changes = append(rep.Changes, c)
		log.Debug("applied", "kind", c.Kind, "name", c.Name, "action", c.Action)
	}
	if err := waitEnforced(ctx, cfg, log); err != nil {
		return rep, err
	}
	log.Info("cluster API installed", "changed", rep.Changed(), "took", time.Since(t0).Round(time.Millisecond))
	return rep, nil
}

// apply server-side applies obj and tells from the resourceVersion before
// and after whether anything changed.
func apply(ctx context.Context, dc dynamic.Interface, obj *unstructured.Unstructured) (Change, error) {
	c := Change{Kind: obj.GetKind(), Name: obj.GetName()}
	ri, err := resourceFor(dc, obj)
	if err != nil {
		return c, err
	}
	before := ""
	cur, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case err == nil:
		before = cur.GetResourceVersion()
	case !apierrors.IsNotFound(err):
		return c, fmt.Errorf("read %s %s: %w", c.Kind, c.Name, err)
	}
	// Force: kubeslot owns these objects; a field someone changed with
	// another tool is put back.
	after, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return c, fmt.Errorf("apply %s %s: %w", c.Kind, c.Name, err)
	}
	switch {
	case before == "":
		c.Action = Created
	case before == after.GetResourceVersion():
		c.Action = Unchanged
	default:
		c.Action = Updated
	}
	return c, nil
}

// waitEstablished polls a CRD until the apiserver reports it Established;
// a name conflict (NamesAccepted False) fails at once.
func waitEstablished(ctx context.Context, dc dynamic.Interface, name string) error {
	ctx, cancel := context.WithTimeout(ctx, EstablishTimeout)
	defer cancel()
	ri := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	last := "not read yet"
	for {
		crd, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			established, why := false, ""
			for _, c := range conds {
				m, _ := c.(map[string]any)
				typ, _ := m["type"].(string)
				status, _ := m["status"].(string)
				msg, _ := m["message"].(string)
				switch {
				case typ == "Established" && status == "True":
					established = true
				case typ == "NamesAccepted" && status == "False":
					return fmt.Errorf("CustomResourceDefinition %s: names not accepted: %s", name, msg)
				case typ == "Established":
					why = msg
				}
			}
			if established {
				return nil
			}
			last = "Established is not True yet"
			if why != "" {
				last += ": " + why
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CustomResourceDefinition %s not established after %v (last: %s)", name, EstablishTimeout, last)
		case <-time.After(pollInterval):
		}
	}
}

// UninstallOptions are the choices of Uninstall.
type UninstallOptions struct {
	// DeleteObjects lets Uninstall go ahead while Machines or
	// MachineOperations exist; deleting the CRDs deletes them all.
	DeleteObjects bool
}

// Uninstall deletes what Install applied, in reverse order (RBAC first, so
// no agent holds a grant without the policy that limits it), and waits until
// the CRDs are gone. Deleting a CRD deletes every Machine and
// MachineOperation with it, so unless opts.DeleteObjects is set it refuses,
// before deleting anything, when any exist (ErrObjectsExist).
func Uninstall(ctx context.Context, cfg *rest.Config, log *slog.Logger, opts UninstallOptions) (Report, error) {
	var rep Report
	crds, access, err := manifests()
	if err != nil {
		return rep, err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return rep, fmt.Errorf("cluster client: %w", err)
	}
	if !opts.DeleteObjects {
		if err := refuseIfObjects(ctx, dc); err != nil {
			return rep, err
		}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return rep, fmt.Errorf("cluster client: %w", err)
	}
	if err := deleteFleetBindings(ctx, cs); err != nil {
		return rep, err
	}
	all := append(append([]*unstructured.Unstructured{}, crds...), access...)
	for i := len(all) - 1; i >= 0; i-- {
		obj := all[i]
		c := Change{Kind: obj.GetKind(), Name: obj.GetName(), Action: Deleted}
		ri, err := resourceFor(dc, obj)
		if err != nil {
			return rep, err
		}
		err = ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
		switch {
		case apierrors.IsNotFound(err):
			c.Action = Absent
		case err != nil:
			return rep, fmt.Errorf("delete %s %s: %w", c.Kind, c.Name, err)
		}
		rep.Changes = append(rep.Changes, c)
		log.Debug("deleted", "kind", c.Kind, "name", c.Name, "action", c.Action)
	}
	for _, obj := range crds {
		if err := waitGone(ctx, dc, obj.GetName()); err != nil {
			return rep, err
		}
	}
	log.Info("cluster API uninstalled", "changed", rep.Changed())
	return rep, nil
}

// ErrObjectsExist is returned by Uninstall when Machines or
// MachineOperations exist and deleteObjects is false.
var ErrObjectsExist = errors.New("objects exist")

func refuseIfObjects(ctx context.Context, dc dynamic.Interface) error {
	var found []string
	for _, res := range []string{v1alpha1.MachinesResource, v1alpha1.MachineOperationsResource} {
		list, err := dc.Resource(v1alpha1.SchemeGroupVersion.WithResource(res)).List(ctx, metav1.ListOptions{Limit: 1})
		switch {
		case apierrors.IsNotFound(err):
			continue // the CRD is not installed
		case err != nil:
			return fmt.Errorf("list %s: %w", res, err)
		}
		if n := len(list.Items) + int(ptrOr(list.GetRemainingItemCount())); n > 0 {
			found = append(found, fmt.Sprintf("%d %s", n, res))
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: %s would be deleted with their CRDs; delete them first, or pass --delete-objects",
			ErrObjectsExist, strings.Join(found, " and "))
	}
	return nil
}

func ptrOr(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func waitGone(ctx context.Context, dc dynamic.Interface, name string) error {
	ctx, cancel := context.WithTimeout(ctx, RemoveTimeout)
	defer cancel()
	ri := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for {
		_, err := ri.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CustomResourceDefinition %s still present %v after deletion (its objects are being removed; last: %v)", name, RemoveTimeout, err)
		case <-time.After(pollInterval):
		}
	}
}
