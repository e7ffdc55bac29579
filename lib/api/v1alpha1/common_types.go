package v1alpha1

// Shared value types. Their validation markers become part of every schema
// that uses them, so a rule is written once.
//
// CEL rules need bounded inputs (the apiserver refuses a CRD whose rules
// could cost too much), hence the MaxLength, MaxItems and MaxProperties
// markers next to them.

// URL is a download location without credentials (user:password@). A
// pre-signed URL may carry its signature in the query; kubeslot never logs
// the query. Each field that uses it says, in a CEL rule of its own, which
// schemes it takes: an http or https URL with a host, and for a rootfs also
// an OCI image reference (RootFS.Source).
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=4096
// +kubebuilder:validation:XValidation:rule="!self.matches('^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@')",message="must not contain credentials (user:password@); put a token in the query of a pre-signed URL instead"
type URL string

// SHA256 is a sha256 digest written as 64 lowercase hexadecimal digits.
//
// +kubebuilder:validation:MaxLength=64
// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9a-f]{64}$')",message="must be a sha256 digest: 64 lowercase hexadecimal digits"
type SHA256 string

// Taint is a node taint in the kubelet's --register-with-taints syntax,
// "key=value:Effect" or "key:Effect", the same syntax as the taints of
// kubeslot's bootstrap configuration (lib/config.ParseTaint). The key is
// [prefix/]name like a label key, the value is empty or like a label value,
// and the effect is NoSchedule, PreferNoSchedule or NoExecute.
//
// +kubebuilder:validation:MaxLength=400
// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?(=([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?)?:(NoSchedule|PreferNoSchedule|NoExecute)$')",message="must be key=value:Effect or key:Effect: key [prefix/]name (name at most 63 letters, digits, '-', '_', '.'), value empty or at most 63 of those characters, Effect one of NoSchedule, PreferNoSchedule, NoExecute"
type Taint string

// TaintEffects are the effects a Taint may name.
var TaintEffects = []string{"NoSchedule", "PreferNoSchedule", "NoExecute"}
