package v1alpha1

// The deep-copy code (zz_generated.deepcopy.go) and the CRDs (crds/) are
// generated from the types and their markers by a pinned controller-gen,
// run through the module proxy so it is not a dependency of the module:
//
//	make generate   (or: go generate ./lib/api/...)
//
// TestGeneratedUpToDate runs it into a temporary directory and fails when
// the committed files differ (it skips when the tool cannot be fetched).

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object crd:crdVersions=v1,maxDescLen=1000 paths=. output:crd:artifacts:config=crds

// ControllerGen is the generator command line, shared by go:generate above
// and by TestGeneratedUpToDate.
const ControllerGen = "sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0"
