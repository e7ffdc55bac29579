// Package kuberelease ties a node's Kubernetes version to what runs: it
// finds the kubelet of a version on a release mirror (a tree laid out like
// the upstream downloads, checked against the published sha256), checks a
// version against the API server's under the upstream version skew policy,
// and reads the version a kubelet binary reports.
//
// Imported by what builds and verifies a slot: lib/slot (the skew and
// release checks), the bootstrap and the repaver (the Pinner), and the
// nspawn backend (for the mirror's CA when it downloads a
// pinned kubelet). It does no download of a binary itself: lib/artifact does.
package kuberelease
