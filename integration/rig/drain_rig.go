package rig

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubeslot/kubeslot/integration/workload"
)

// DeployUnbound is p.deploy's Deployment (two pods app=web with a readiness probe) left to the stand-in scheduler:
// no spec.nodeName in its template.
func (p *PodsRig) DeployUnbound(ctx context.Context, ns string) {
	p.t.Helper()
	two, no, grace := int32(2), false, int64(2)
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: &two, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Tolerations:                  []corev1.Toleration{{Key: "kubeslot.dev/rig", Operator: corev1.TolerationOpExists}},
				AutomountServiceAccountToken: &no, EnableServiceLinks: &no, TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "web", Image: PodsImage, ImagePullPolicy: corev1.PullIfNotPresent,
					Ports: []corev1.ContainerPort{{ContainerPort: workload.Port}},
					ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(workload.Port)}}}}}}}}}
	if _, err := p.Admin.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
}
