// Package machineclient is the agent's typed view of the cluster API: get
// its own Machine, create it, read and list MachineOperations, publish
// status with optimistic concurrency and bounded retries on conflict, and
// delete a finished operation exactly as it was read; the REST client
// under it serves the watcher's informers. It is a thin layer over a
// client-go REST client for lib/api/v1alpha1 (no controller-runtime).
// Imported by lib/watcher, lib/bootstrap, lib/clusterinstall and the
// kubeslot CLI; the rig's tests add what only they do
// (integration/machineapi).
package machineclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// Client reads and writes Machines and MachineOperations.
type Client struct {
	rest rest.Interface
	// Retry bounds the conflict retries of the status helpers.
	Retry RetryPolicy
}

// RetryPolicy bounds how often, and how patiently, a status write that lost
// a race (409 Conflict) is tried again with a fresh read. The pauses are
// jittered: hundreds of agents write one operation's status, and those that
// collided must not all come back together.
type RetryPolicy struct {
	// Attempts is the most writes made in total (default 8).
	Attempts int
	// Backoff is the pause after the first conflict (default 50 ms, at
	// most maxPause); it doubles, each pause lengthened by up to half at
	// random, and the retries end once it would pass maxPause (client-go's
	// wait.Backoff cap). By default that is 6 writes and at most about
	// 4.7 s of pauses.
	Backoff time.Duration
}

// maxPause caps a pause between two conflicting writes.
const maxPause = 2 * time.Second

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.Attempts <= 0 {
		p.Attempts = 8
	}
	if p.Backoff <= 0 {
		p.Backoff = 50 * time.Millisecond
	}
	p.Backoff = min(p.Backoff, maxPause)
	return p
}

func (p RetryPolicy) backoff() wait.Backoff {
	p = p.withDefaults()
	return wait.Backoff{Duration: p.Backoff, Factor: 2, Jitter: 0.5, Steps: p.Attempts, Cap: maxPause}
}

// Scheme knows the kubeslot types (and metav1's options and status).
var Scheme = runtime.NewScheme()

func init() {
	if err := v1alpha1.AddToScheme(Scheme); err != nil {
		panic(err) // a registration bug, caught by every test
	}
	metav1.AddToGroupVersion(Scheme, metav1.SchemeGroupVersion)
}

// New returns a Client for the cluster cfg points at. cfg is copied.
func New(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	gv := v1alpha1.SchemeGroupVersion
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(Scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubeslot API client: %w", err)
	}
	return &Client{rest: rc}, nil
}

// GetMachine reads the Machine name.
func (c *Client) GetMachine(ctx context.Context, name string) (*v1alpha1.Machine, error) {
	m := &v1alpha1.Machine{}
	err := c.rest.Get().Resource(v1alpha1.MachinesResource).Name(name).Do(ctx).Into(m)
	if err != nil {
		return nil, fmt.Errorf("get Machine %s: %w", name, err)
	}
	return m, nil
}

// CreateMachine creates m. An agent may create only the Machine whose
// spec.nodeName is its own node.
func (c *Client) CreateMachine(ctx context.Context, m *v1alpha1.Machine) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.rest.Post().Resource(v1alpha1.MachinesResource).Body(m).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("create Machine %s: %w", m.Name, err)
	}
	return out, nil
}

// ListOperations lists every MachineOperation, with the list's
// resourceVersion to watch from.
func (c *Client) ListOperations(ctx context.Context) (*v1alpha1.MachineOperationList, error) {
	l := &v1alpha1.MachineOperationList{}
	err := c.rest.Get().Resource(v1alpha1.MachineOperationsResource).Do(ctx).Into(l)
	if err != nil {
		return nil, fmt.Errorf("list MachineOperations: %w", err)
	}
	return l, nil
}

// DeleteFinishedOperation deletes the MachineOperation name only while it is
// still the object with uid at resourceVersion (delete preconditions): a
// newer version, or another object created since under the same name, is
// never deleted. The apiserver answers 409 Conflict when a precondition does
// not hold and 404 Not Found when the object is gone; both are returned as
// errors (apierrors.IsConflict, apierrors.IsNotFound). An agent may delete
// only finished operations of its own Machine that set
// ttlSecondsAfterFinished (see lib/api/v1alpha1/access).
func (c *Client) DeleteFinishedOperation(ctx context.Context, name string, uid types.UID, resourceVersion string) error {
	if uid == "" || resourceVersion == "" {
		return fmt.Errorf("delete MachineOperation %s: uid %q and resourceVersion %q are both required as preconditions", name, uid, resourceVersion)
	}
	// Encoded by hand, without apiVersion and kind: the apiserver reads a
	// delete body as meta.k8s.io/v1 DeleteOptions by default.
	body, err := json.Marshal(&metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &resourceVersion}})
	if err != nil {
		return fmt.Errorf("delete MachineOperation %s: encode options: %w", name, err)
	}
	err = c.rest.Delete().Resource(v1alpha1.MachineOperationsResource).Name(name).
		SetHeader("Content-Type", "application/json").Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("delete MachineOperation %s (uid %s, resourceVersion %s): %w", name, uid, resourceVersion, err)
	}
	return nil
}

// UpdateMachineStatus reads the Machine name, lets mutate change its status,
// and writes the status back, guarded by the resourceVersion it read; on a
// conflict it reads again and calls mutate again (so mutate must start from
// what it is given), within c.Retry. If mutate returns an error nothing is
// written and that error is returned; if it returns ErrNoChange nothing is
// written either, and the Machine as read is returned.
func (c *Client) UpdateMachineStatus(ctx context.Context, name string, mutate func(*v1alpha1.Machine) error) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.retryOnConflict(ctx, func() error {
		m, err := c.GetMachine(ctx, name)
		if err != nil {
			return err
		}
		if err := mutate(m); err != nil {
			if errors.Is(err, ErrNoChange) {
				*out = *m
			}
			return err
		}
		return c.patchStatus(ctx, v1alpha1.MachinesResource, name, m.ResourceVersion, m.Status, out)
	})
	if err != nil {
		if errors.Is(err, ErrNoChange) {
			return out, nil
		}
		return nil, fmt.Errorf("update status of Machine %s: %w", name, err)
	}
	return out, nil
}

// UpdateOperationStatus does for a MachineOperation what UpdateMachineStatus
// does for a Machine. An agent uses it with v1alpha1.SetMachineResult.
func (c *Client) UpdateOperationStatus(ctx context.Context, name string, mutate func(*v1alpha1.MachineOperation) error) (*v1alpha1.MachineOperation, error) {
	out := &v1alpha1.MachineOperation{}
	err := c.retryOnConflict(ctx, func() error {
		op, err := c.GetOperation(ctx, name)
		if err != nil {
			return err
		}
		if err := mutate(op); err != nil {
			if errors.Is(err, ErrNoChange) {
				*out = *op
			}
			return err
		}
		return c.patchStatus(ctx, v1alpha1.MachineOperationsResource, name, op.ResourceVersion, op.Status, out)
	})
	if err != nil {
		if errors.Is(err, ErrNoChange) {
			return out, nil
		}
		return nil, fmt.Errorf("update status of MachineOperation %s: %w", name, err)
	}
	return out, nil
}

// ErrNoChange, returned by a mutate function, means there is nothing to
// write.
var ErrNoChange = errors.New("no change")

// patchStatus replaces the status subresource with a JSON patch that also
// sets metadata.resourceVersion: the apiserver applies it only to that
// version of the object and answers 409 Conflict otherwise, so a status
// computed from a stale read never lands.
func (c *Client) patchStatus(ctx context.Context, resource, name, resourceVersion string, status any, into runtime.Object) error {
	if resourceVersion == "" {
		return fmt.Errorf("%s %s: no resourceVersion to guard the write", resource, name)
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "replace", "path": "/metadata/resourceVersion", "value": resourceVersion},
		{"op": "add", "path": "/status", "value": status},
	})
	if err != nil {
		return fmt.Errorf("%s %s: encode status: %w", resource, name, err)
	}
	return c.rest.Patch(types.JSONPatchType).Resource(resource).Name(name).SubResource("status").
		Body(patch).Do(ctx).Into(into)
}

// retryOnConflict runs write until it does not fail with a conflict, within
// c.Retry (retry.RetryOnConflict). A pause is not cut short by ctx, but it
// is bounded (maxPause and its jitter), and a write after ctx ended fails
// at once.
func (c *Client) retryOnConflict(ctx context.Context, write func() error) error {
	writes := 0
	err := retry.RetryOnConflict(c.Retry.backoff(), func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		writes++
		return write()
	})
	if err == nil || (ctx.Err() == nil && !apierrors.IsConflict(err)) {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w (after %d conflicting writes: %v)", ctx.Err(), writes, err)
	}
	return fmt.Errorf("gave up after %d conflicting writes: %w", writes, err)
}
