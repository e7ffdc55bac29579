package clusterinstall

// Enrolling a node makes it a member of the fleet: a binding of the
// ClusterRole kubeslot:fleet-member to that node alone, the only grant that
// lets a node write anything of kubeslot's (register its Machine, report
// status, take rollout slots), and the label every selector operation
// requires (v1alpha1.LabelEnrolled) on its Machine. Both are a cluster
// admin's: nodes bind no roles, and set no label but that one on the
// Machine they may register only once bound. Enrolling before the host
// joins is the usual order: the agent then registers its Machine already
// labelled; a Machine that exists (an admin's, or one registered before)
// gets the label here.

import (
	"context"
	"fmt"
	"log/slog"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/machineclient"
)

// FleetMemberRole is the ClusterRole enrollment binds to a node.
const FleetMemberRole = "kubeslot:fleet-member"

// FleetMemberBinding is the name of node's binding of FleetMemberRole.
func FleetMemberBinding(node string) string { return FleetMemberRole + ":" + node }

// Enroll enrolls the Machines named (enroll false: takes them out of the
// fleet), each with its node's binding. A name with no Machine yet is a
// node's: a host's agent registers its Machine under its node's name, so
// the binding alone is made (or removed) and the agent's registration
// brings the label. It is idempotent, and it returns what it did, a line
// per name.
func Enroll(ctx context.Context, cfg *rest.Config, names []string, enroll bool, log *slog.Logger) ([]string, error) {
	mc, err := machineclient.New(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range names {
		var node string
		absent := false
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			m, err := mc.GetMachine(ctx, name)
			if apierrors.IsNotFound(err) {
				node, absent = name, true
				return nil
			}
			if err != nil {
				return err
			}
			node = m.Spec.NodeName
			if (m.Labels[v1alpha1.LabelEnrolled] == "true") == enroll {
				return nil
			}
			if enroll {
				if m.Labels == nil {
					m.Labels = map[string]string{}
				}
				m.Labels[v1alpha1.LabelEnrolled] = "true"
			} else {
				delete(m.Labels, v1alpha1.LabelEnrolled)
			}
			_, err = mc.UpdateMachine(ctx, m)
			return err
		})
		if err != nil {
			return out, fmt.Errorf("enroll machine %s: %w", name, err)
		}
		if node == "" {
			return out, fmt.Errorf("machine %s has no spec.nodeName", name)
		}
		if err := BindFleetMember(ctx, cs, node, enroll); err != nil {
			return out, fmt.Errorf("machine %s, node %s: %w", name, node, err)
		}
		what := "enrolled"
		if !enroll {
			what = "removed from the fleet"
		}
		if absent {
			log.Info("node "+what+"; it has no Machine yet", "node", node, "binding", FleetMemberBinding(node))
			out = append(out, fmt.Sprintf("%s node %s (ClusterRoleBinding %s; no Machine %s yet: its agent registers it, enrolled)",
				what, node, FleetMemberBinding(node), name))
			continue
		}
		log.Info("Machine "+what, "machine", name, "node", node, "binding", FleetMemberBinding(node))
		out = append(out, fmt.Sprintf("%s %s (node %s, ClusterRoleBinding %s)", what, name, node, FleetMemberBinding(node)))
	}
	return out, nil
}

// BindFleetMember creates (or, bind false, deletes) node's binding.
func BindFleetMember(ctx context.Context, cs kubernetes.Interface, node string, bind bool) error {
	name := FleetMemberBinding(node)
	crbs := cs.RbacV1().ClusterRoleBindings()
	if !bind {
		if err := crbs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ClusterRoleBinding %s: %w", name, err)
		}
		return nil
	}
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "kubeslot"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: FleetMemberRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: v1alpha1.AgentUsername(node)}},
	}
	_, err := crbs.Create(ctx, b, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := crbs.Get(ctx, name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		if cur.RoleRef == b.RoleRef && len(cur.Subjects) == 1 && cur.Subjects[0] == b.Subjects[0] {
			return nil
		}
		return fmt.Errorf("ClusterRoleBinding %s exists with another role or subjects; delete it, then enroll again", name)
	}
	if err != nil {
		return fmt.Errorf("create ClusterRoleBinding %s: %w", name, err)
	}
	return nil
}

// deleteFleetBindings removes every node's binding (uninstall).
func deleteFleetBindings(ctx context.Context, cs kubernetes.Interface) error {
	l, err := cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=kubeslot"})
	if err != nil {
		return fmt.Errorf("list ClusterRoleBindings: %w", err)
	}
	for _, b := range l.Items {
		if b.RoleRef.Name != FleetMemberRole {
			continue
		}
		if err := cs.RbacV1().ClusterRoleBindings().Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ClusterRoleBinding %s: %w", b.Name, err)
		}
	}
	return nil
}
