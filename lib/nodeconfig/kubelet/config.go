package kubelet

// Config is the part of KubeletConfiguration that kubeslot sets: the
// upstream fields by their JSON names, of the same JSON shape
// (TestConfigIsUpstreams). A field without omitempty is always written, its
// zero included: readOnlyPort 0 and protectKernelDefaults false are
// settings of README's CIS table, an empty enforceNodeAllocatable enforces
// nothing (absent, the kubelet would enforce pods), and empty taints and
// DNS servers say "none" in the file.
type Config struct {
	APIVersion                     string         `json:"apiVersion"`
	Kind                           string         `json:"kind"`
	Address                        string         `json:"address"`
	Port                           int32          `json:"port"`
	ReadOnlyPort                   int32          `json:"readOnlyPort"`
	HealthzBindAddress             string         `json:"healthzBindAddress"`
	HealthzPort                    int32          `json:"healthzPort"`
	Authentication                 Authentication `json:"authentication"`
	Authorization                  Authorization  `json:"authorization"`
	ServerTLSBootstrap             bool           `json:"serverTLSBootstrap"`
	RotateCertificates             bool           `json:"rotateCertificates"`
	TLSCipherSuites                []string       `json:"tlsCipherSuites"`
	StreamingConnectionIdleTimeout string         `json:"streamingConnectionIdleTimeout"`
	EventRecordQPS                 int32          `json:"eventRecordQPS"`
	PodPidsLimit                   int64          `json:"podPidsLimit"`
	SeccompDefault                 bool           `json:"seccompDefault"`
	ContainerRuntimeEndpoint       string         `json:"containerRuntimeEndpoint"`
	RegisterNode                   bool           `json:"registerNode"`
	RegisterWithTaints             []Taint        `json:"registerWithTaints"`
	ClusterDomain                  string         `json:"clusterDomain"`
	ClusterDNS                     []string       `json:"clusterDNS"`
	FailSwapOn                     bool           `json:"failSwapOn"`
	ProtectKernelDefaults          bool           `json:"protectKernelDefaults"`
	MakeIPTablesUtilChains         bool           `json:"makeIPTablesUtilChains"`
	CgroupDriver                   string         `json:"cgroupDriver"`
	CgroupsPerQOS                  bool           `json:"cgroupsPerQOS"`
	EnforceNodeAllocatable         []string       `json:"enforceNodeAllocatable"`
	// FailCgroupV1 and OOMScoreAdj are written only when set.
	FailCgroupV1   *bool             `json:"failCgroupV1,omitempty"`
	OOMScoreAdj    *int32            `json:"oomScoreAdj,omitempty"`
	KubeReserved   map[string]string `json:"kubeReserved,omitempty"`
	SystemReserved map[string]string `json:"systemReserved,omitempty"`
}

// Authentication is the kubelet API's authentication.
type Authentication struct {
	Anonymous struct {
		Enabled bool `json:"enabled"`
	} `json:"anonymous"`
	Webhook struct {
		Enabled  bool   `json:"enabled"`
		CacheTTL string `json:"cacheTTL"`
	} `json:"webhook"`
	X509 struct {
		ClientCAFile string `json:"clientCAFile"`
	} `json:"x509"`
}

// Authorization is the kubelet API's authorization.
type Authorization struct {
	Mode    string `json:"mode"`
	Webhook struct {
		CacheAuthorizedTTL   string `json:"cacheAuthorizedTTL"`
		CacheUnauthorizedTTL string `json:"cacheUnauthorizedTTL"`
	} `json:"webhook"`
}

// Taint is a taint the kubelet registers the Node with.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}
