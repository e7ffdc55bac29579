package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every kubeslot resource.
const GroupName = "kubeslot.dev"

// SchemeGroupVersion is the group and version of the types in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource names, as they appear in URLs, RBAC rules and admission requests.
const (
	MachinesResource          = "machines"
	MachineOperationsResource = "machineoperations"
	RolloutLeasesResource     = "rolloutleases"
	RolloutStopsResource      = "rolloutstops"
)

// Resource returns a GroupResource of this group.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers Machine, MachineOperation, RolloutLease and RolloutStop (and their lists)
	// with a scheme, for REST clients and serializers.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion,
		&Machine{}, &MachineList{},
		&MachineOperation{}, &MachineOperationList{},
		&RolloutLease{}, &RolloutLeaseList{},
		&RolloutStop{}, &RolloutStopList{},
	)
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
