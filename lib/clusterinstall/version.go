package clusterinstall

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	apiversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// MinKubernetesVersion is the oldest control plane the cluster API works on.
// The Machine and MachineOperation CRDs declare selectable fields (agents
// list by spec.nodeName), served without a feature gate only from 1.32; the
// admission policies are admissionregistration.k8s.io/v1, GA in 1.30. An
// older apiserver would take the CRDs and drop the selectable fields, or
// refuse the policies halfway through an install.
const MinKubernetesVersion = "1.32"

// MinVersionNote is the comment `cluster manifests` and the kustomize base
// carry, for whoever applies them without `cluster install`.
const MinVersionNote = "needs Kubernetes " + MinKubernetesVersion + " or later (CRD selectable fields; ValidatingAdmissionPolicy v1)"

// serverVersioner asks the apiserver its version (GET /version).
type serverVersioner interface {
	ServerVersion(ctx context.Context) (*apiversion.Info, error)
}

// checkVersion refuses an apiserver older than MinKubernetesVersion; Install
// calls it before it applies anything.
func checkVersion(ctx context.Context, sv serverVersioner) error {
	info, err := sv.ServerVersion(ctx)
	if err != nil {
		return fmt.Errorf("read the apiserver's version: %w", err)
	}
	got, err := parseServerVersion(info)
	if err != nil {
		return err
	}
	if !got.AtLeast(version.MustParseGeneric(MinKubernetesVersion)) {
		return fmt.Errorf("the apiserver runs Kubernetes %s; kubeslot's cluster API needs %s or later "+
			"(CRD selectable fields; ValidatingAdmissionPolicy v1): upgrade the control plane first, nothing was applied",
			info.GitVersion, MinKubernetesVersion)
	}
	return nil
}

// parseServerVersion reads gitVersion ("v1.37.2", "v1.33.1-eks-..."), else
// major and minor (some providers set minor to "33+").
func parseServerVersion(info *apiversion.Info) (*version.Version, error) {
	if v, err := version.ParseGeneric(info.GitVersion); err == nil {
		return v, nil
	}
	mm := info.Major + "." + strings.TrimSuffix(info.Minor, "+")
	v, err := version.ParseGeneric(mm)
	if err != nil {
		return nil, fmt.Errorf("the apiserver's version %q (major %q, minor %q) is not a Kubernetes version", info.GitVersion, info.Major, info.Minor)
	}
	return v, nil
}

// versionClientFor is the apiserver's version endpoint, read with the caller's
// context through the client the dynamic client uses, whose decoder reads an
// error Status (a 403's message reaches the user; discovery's does not).
func versionClientFor(cfg *rest.Config) (serverVersioner, error) {
	rc, err := rest.UnversionedRESTClientFor(dynamic.ConfigFor(cfg))
	if err != nil {
		return nil, fmt.Errorf("cluster client: %w", err)
	}
	return versionClient{rc}, nil
}

type versionClient struct{ rc rest.Interface }

func (c versionClient) ServerVersion(ctx context.Context) (*apiversion.Info, error) {
	res := c.rc.Get().AbsPath("/version").Do(ctx)
	if err := res.Error(); err != nil { // Error, unlike Raw, decodes the server's Status
		return nil, err
	}
	body, _ := res.Raw()
	var info apiversion.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("decode /version: %w", err)
	}
	return &info, nil
}
