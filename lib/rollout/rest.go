package rollout

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// REST is the Store of a cluster, over a REST client for kubeslot.dev
// (machineclient.Client.REST). Errors keep the apiserver's status, so
// apierrors.IsConflict and friends see through them.
type REST struct {
	Client rest.Interface
}

var parameterCodec = func() runtime.ParameterCodec {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, v1alpha1.SchemeGroupVersion)
	return runtime.NewParameterCodec(s)
}()

// List lists the leases labelled with op.
func (r REST) List(ctx context.Context, op string) ([]v1alpha1.RolloutLease, error) {
	out := &v1alpha1.RolloutLeaseList{}
	opts := &metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{v1alpha1.LabelOperation: op}).String()}
	err := r.Client.Get().Resource(v1alpha1.RolloutLeasesResource).VersionedParams(opts, parameterCodec).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("list the rollout leases of operation %s: %w", op, err)
	}
	return out.Items, nil
}

// Get reads lease name.
func (r REST) Get(ctx context.Context, name string) (*v1alpha1.RolloutLease, error) {
	out := &v1alpha1.RolloutLease{}
	if err := r.Client.Get().Resource(v1alpha1.RolloutLeasesResource).Name(name).Do(ctx).Into(out); err != nil {
		return nil, fmt.Errorf("get rollout lease %s: %w", name, err)
	}
	return out, nil
}

// Create creates l.
func (r REST) Create(ctx context.Context, l *v1alpha1.RolloutLease) (*v1alpha1.RolloutLease, error) {
	out := &v1alpha1.RolloutLease{}
	if err := r.Client.Post().Resource(v1alpha1.RolloutLeasesResource).Body(l).Do(ctx).Into(out); err != nil {
		return nil, fmt.Errorf("create rollout lease %s: %w", l.Name, err)
	}
	return out, nil
}

// Update writes l at its resourceVersion.
func (r REST) Update(ctx context.Context, l *v1alpha1.RolloutLease) (*v1alpha1.RolloutLease, error) {
	out := &v1alpha1.RolloutLease{}
	if err := r.Client.Put().Resource(v1alpha1.RolloutLeasesResource).Name(l.Name).Body(l).Do(ctx).Into(out); err != nil {
		return nil, fmt.Errorf("update rollout lease %s: %w", l.Name, err)
	}
	return out, nil
}

// Delete deletes lease name if it is still at resourceVersion.
func (r REST) Delete(ctx context.Context, name, resourceVersion string) error {
	body, err := json.Marshal(metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &resourceVersion}})
	if err != nil {
		return fmt.Errorf("delete rollout lease %s: encode options: %w", name, err)
	}
	err = r.Client.Delete().Resource(v1alpha1.RolloutLeasesResource).Name(name).
		SetHeader("Content-Type", "application/json").Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("delete rollout lease %s: %w", name, err)
	}
	return nil
}
