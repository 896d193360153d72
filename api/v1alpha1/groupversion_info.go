// Package v1alpha1 holds the hoplink.dev/v1alpha1 API: RelayNode, Chain and
// Tunnel. Local mode reads these types from YAML files; the operator serves
// them as CRDs. The package imports nothing else of hoplink's.
//
// +kubebuilder:object:generate=true
// +groupName=hoplink.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of every kind in this package.
var GroupVersion = schema.GroupVersion{Group: "hoplink.dev", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the kinds of this package with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&RelayNode{}, &RelayNodeList{},
		&Chain{}, &ChainList{},
		&Tunnel{}, &TunnelList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
