package node

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// checkCISOnRig checks README's CIS table (lib/nodeconfig TestCISProfile asserts it on the rendered profile) on
// r's running node in slot: the kubelet's files in the slot's rootfs are root's with mode 0600 or stricter, and
// the kubelet's live configuration (its /configz, through the apiserver's node proxy) has the table's values.
// The expectations are written out again here: production code exports nothing for a test.
func checkCISOnRig(t *testing.T, ctx context.Context, r *rig.Rig, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	// 4.1: the kubelet unit and its node-IP drop-in, the kubeconfigs (the kubelet writes its own), the client
	// CA, the kubelet configuration. PrivateUsers=no: the host's owners are the node's.
	rootfs := path.Join(hostroot.MachinesDir, slot)
	for _, p := range []string{nodeconfig.KubeletUnitPath, nodeconfig.NodeIPDropIn, nodeconfig.BootstrapKubeconfig,
		nodeconfig.KubeletKubeconfig, nodeconfig.CAFile, nodeconfig.KubeletConfig} {
		out, err := r.H.Run(ctx, "stat", "-c", "%a %U:%G", rootfs+p)
		if err != nil {
			t.Errorf("CIS 4.1: stat %s: %v", p, err)
			continue
		}
		mode, owner, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m&^0o600 != 0 || owner != "root:root" {
			t.Errorf("CIS 4.1: %s has mode %s, owner %s; want 600 or stricter, root:root", p, mode, owner)
		}
	}

	// 4.2: what the kubelet runs with. configz leaves out false and zero values it has no pointer for (readOnlyPort
	// 0, protectKernelDefaults false): a missing key counts as its zero value.
	raw, err := r.Admin.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", r.Node, "proxy", "configz").DoRaw(ctx)
	if err != nil {
		t.Errorf("CIS 4.2: GET the kubelet's configz through the apiserver: %v\n%s", err, raw)
		return
	}
	var cz struct {
		KubeletConfig map[string]any `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw, &cz); err != nil || cz.KubeletConfig == nil {
		t.Errorf("CIS 4.2: configz: %v\n%s", err, raw)
		return
	}
	want := []struct {
		item, key string
		value     any // as JSON decodes it
	}{
		{"4.2.1", "authentication.anonymous.enabled", false},
		{"4.2.2", "authorization.mode", "Webhook"},
		{"4.2.3", "authentication.x509.clientCAFile", nodeconfig.CAFile},
		{"4.2.4", "readOnlyPort", 0.0},
		{"4.2.5", "streamingConnectionIdleTimeout", "4h0m0s"},
		{"4.2.6", "makeIPTablesUtilChains", false},
		{"4.2.8", "eventRecordQPS", 50.0},
		{"4.2.9", "serverTLSBootstrap", true},
		{"4.2.10", "rotateCertificates", true},
		{"4.2.12", "tlsCipherSuites", []any{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
			"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
			"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"}},
		{"4.2.13", "podPidsLimit", 4096.0},
		{"4.2.14", "seccompDefault", true},
		{"(4.2.6 up to v1.8)", "protectKernelDefaults", false},
	}
	for _, w := range want {
		got := configzValue(cz.KubeletConfig, w.key, w.value)
		if g, e := fmt.Sprint(got), fmt.Sprint(w.value); g != e {
			t.Errorf("CIS %s: the kubelet runs with %s = %s, want %s", w.item, w.key, g, e)
		}
	}
	// 4.2.11: the serving certificate's rotation is not turned off.
	if gates, _ := cz.KubeletConfig["featureGates"].(map[string]any); gates["RotateKubeletServerCertificate"] == false {
		t.Errorf("CIS 4.2.11: the kubelet runs with RotateKubeletServerCertificate=false")
	}
}

// configzValue is the dotted key's value in doc, or zero's zero value when configz left it out.
func configzValue(doc map[string]any, key string, zero any) any {
	var cur any = doc
	for _, k := range strings.Split(key, ".") {
		m, _ := cur.(map[string]any)
		v, ok := m[k]
		if !ok {
			switch zero.(type) {
			case bool:
				return false
			case float64:
				return 0.0
			case string:
				return ""
			}
			return nil
		}
		cur = v
	}
	return cur
}
