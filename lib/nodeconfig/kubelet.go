package nodeconfig

import (
	"fmt"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/nodeconfig/kubelet"
)

// kubeletConfig is the kubelet's configuration file: kubeslot's base
// (kubeletBase) with the user's override ([node.kubelet] config, or a
// Machine's spec.node.kubelet.config) laid over it key by key.
func kubeletConfig(cfg *config.Config, opts Options) ([]byte, error) {
	base, err := kubeletBase(cfg, opts)
	if err != nil {
		return nil, err
	}
	header := "# Written by kubeslot; it is rewritten on every configure.\n" +
		"# Cgroup profile " + string(opts.CgroupProfile()) + ".\n"
	override := cfg.Node.Kubelet.Config
	if len(override) > 0 {
		header += "# Laid over kubeslot's keys ([node.kubelet] config, or the Machine's spec.node.kubelet.config): " +
			strings.Join(config.SortedKeys(override), ", ") + ".\n"
	}
	return kubelet.Render(base, override, header)
}

// kubeletBase is kubeslot's kubelet configuration. The kubelet API
// (logs, exec, port-forward, metrics) listens on the node address: only
// clients with a certificate of the cluster CA or a token the apiserver
// accepts, each request authorized by the apiserver (SubjectAccessReview).
// Its serving certificate comes from the cluster (a kubelet-serving CSR, to
// be approved by the cluster's approver) and is kept in the node identity.
// Eviction thresholds and image garbage collection are the kubelet's
// defaults.
func kubeletBase(cfg *config.Config, opts Options) (*kubelet.Config, error) {
	k := cfg.Kubernetes
	taints := []kubelet.Taint{}
	for i, s := range k.Taints {
		t, err := config.ParseTaint(s)
		if err != nil {
			return nil, fmt.Errorf("kubernetes.taints[%d] %q: %w", i, s, err)
		}
		taints = append(taints, kubelet.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
	}
	kubeletPort, healthzPort := opts.Ports()
	address := "0.0.0.0"
	if opts.NodeIP != "" {
		address = opts.NodeIP
	}
	c := &kubelet.Config{
		APIVersion:         kubelet.APIVersion,
		Kind:               kubelet.Kind,
		Address:            address,
		Port:               int32(kubeletPort),
		ReadOnlyPort:       0,
		HealthzBindAddress: "127.0.0.1",
		HealthzPort:        int32(healthzPort),
		ServerTLSBootstrap: true,
		RotateCertificates: true,
		// TLS 1.2 with forward secrecy and AEAD ciphers only (TLS 1.3's
		// suites are fixed).
		TLSCipherSuites: tlsCipherSuites,
		// An exec, attach or port-forward stream idle this long is closed
		// (the kubelet's default, written out so that it is checked).
		StreamingConnectionIdleTimeout: duration(4 * time.Hour),
		EventRecordQPS:                 50,
		// One pod's fork bomb stops at its own limit, not the node's.
		PodPidsLimit: podPidsLimit,
		// A container without a seccomp profile gets the runtime's default.
		SeccompDefault:           true,
		ContainerRuntimeEndpoint: "unix://" + ContainerdSocket,
		RegisterNode:             true,
		RegisterWithTaints:       taints,
		ClusterDomain:            k.ClusterDomain,
		ClusterDNS:               append([]string{}, k.ClusterDNS...),
		FailSwapOn:               false,
		// Leave the kernel alone: the sysctls the kubelet wants are bound
		// read-only over /proc/sys (see the unit), since /proc/sys is
		// read-only in a node; the firewall is the host's and the CNI's,
		// not the kubelet's.
		ProtectKernelDefaults:  false,
		MakeIPTablesUtilChains: false,
		KubeReserved:           cfg.Node.KubeReserved,
		SystemReserved:         cfg.Node.SystemReserved,
	}
	c.Authentication.Anonymous.Enabled = false
	c.Authentication.Webhook.Enabled, c.Authentication.Webhook.CacheTTL = true, duration(2*time.Minute)
	c.Authentication.X509.ClientCAFile = CAFile
	c.Authorization.Mode = "Webhook"
	c.Authorization.Webhook.CacheAuthorizedTTL, c.Authorization.Webhook.CacheUnauthorizedTTL = duration(5*time.Minute), duration(30*time.Second)
	switch opts.CgroupProfile() {
	case CgroupsSystemd:
		// cgroup v2 with the controllers delegated to the node: pods in
		// QoS cgroups, node allocatable enforced for them.
		c.CgroupDriver, c.CgroupsPerQOS, c.EnforceNodeAllocatable = "systemd", true, []string{"pods"}
	case CgroupsNoControllers:
		// This host cannot give the node the cpu, memory and pids
		// controllers (cgroup v1 or hybrid: nspawn mounts the v1
		// controllers read-only), so there are no QoS cgroups and nothing
		// is enforced; the kubelet must accept cgroup v1.
		c.FailCgroupV1 = new(bool)
		c.CgroupDriver, c.CgroupsPerQOS, c.EnforceNodeAllocatable = "cgroupfs", false, []string{}
	}
	if opts.RestrictOOMScoreAdj {
		// The sandbox's machine withholds CAP_SYS_RESOURCE: the kubelet's
		// default -999 needs it, and without it the kubelet tries twice,
		// 100 ms apart, inside every start's downtime. 0 needs no
		// capability.
		c.OOMScoreAdj = new(int32)
	}
	return c, nil
}

// tlsCipherSuites are the kubelet API's TLS 1.2 ciphers: ECDHE key
// exchange and AEAD only, for the ECDSA key the kubelet makes for its
// serving certificate and for an RSA one. They are the forward-secret part
// of the CIS benchmark's strong list.
var tlsCipherSuites = []string{
	"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
	"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
	"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
	"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
	"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
	"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
}

// podPidsLimit is the kubelet's limit on the processes (threads count) of
// one pod: far above what a service needs, far below a node's pid_max, so a
// runaway pod cannot starve the node of process IDs.
const podPidsLimit = 4096

// duration writes d as the kubelet's configuration does (metav1.Duration).
func duration(d time.Duration) string { return d.String() }
