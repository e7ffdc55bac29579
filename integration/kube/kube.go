// Package kube runs a real, throw-away Kubernetes control plane on 127.0.0.1
// for kubeslot's whole-system tests: etcd, kube-apiserver and optionally a
// kube-controller-manager that approves and signs kubelet CSRs (TLS
// bootstrap). It generates its own PKI, static tokens and bootstrap tokens,
// and hands out credentials for admin, node and agent identities.
//
// Only test code under integration/ imports it. The binaries come from
// scripts/kube-bins.sh (see BinDir).
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// Options configure Start.
type Options struct {
	// BinDir holds etcd, kube-apiserver and, with ControllerManager,
	// kube-controller-manager. See BinDir().
	BinDir string
	// Dir is the work directory (PKI, etcd data, logs). Empty: a new
	// temporary directory that Stop removes (unless KUBESLOT_KEEP_KUBE_DIR=1).
	Dir string
	// Log receives progress; nil discards it.
	Log *slog.Logger
	// ControllerManager also starts kube-controller-manager with the CSR
	// approving/signing/cleaning controllers and the bootstrap token cleaner.
	ControllerManager bool
	// Workloads (with ControllerManager) also runs the controllers pods on a node need without a scheduler:
	// deployments, replica sets, daemon sets (whose pods a test binds: there is no scheduler), service accounts,
	// node CIDR allocation (PodCIDR below) for bridge networks, and PodDisruptionBudgets' status (evictions).
	Workloads bool
	// Users adds static-token identities to the built-in ones (see TokenFor).
	Users []User
	// ReadyTimeout bounds the wait for /readyz (default 90 s: a loaded
	// 2-core machine takes 3–10 s).
	ReadyTimeout time.Duration
	// ClusterEgress sends kube-apiserver's traffic to nodes (logs, exec, port-forward, node proxy) through a CONNECT
	// proxy of the test process that dials inside the rig hosts' network namespaces (RouteEgress, egress.go).
	// Off: the apiserver dials directly from the machine's namespace.
	ClusterEgress bool
}

// ControlPlane is a running control plane. Its methods are safe for
// concurrent use.
type ControlPlane struct {
	dir    string
	ownDir bool
	log    *slog.Logger
	pki    *pki
	url    string
	users  []tokenUser
	launch *launcher
	egress *egress // Options.ClusterEgress

	mu    sync.Mutex
	procs []*proc // start order: etcd, kube-apiserver, kube-controller-manager

	stopOnce sync.Once
	stopErr  error
}

// Start brings up etcd and kube-apiserver (and kube-controller-manager when
// asked), waits until /readyz answers 200, and creates the RBAC bindings TLS
// bootstrap needs. On error nothing is left running, and the error carries
// the tail of the failing component's log.
func Start(ctx context.Context, o Options) (_ *ControlPlane, err error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 90 * time.Second
	}
	if o.BinDir == "" {
		return nil, errors.New("kube: Options.BinDir is empty (see kube.BinDir)")
	}
	need := []string{"etcd", "kube-apiserver"}
	if o.ControllerManager {
		need = append(need, "kube-controller-manager")
	}
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return nil, fmt.Errorf("kube: binary %s: %w", b, err)
		}
	}
	c := &ControlPlane{dir: o.Dir, log: o.Log}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "kubeslot-kube-"); err != nil {
			return nil, fmt.Errorf("kube: %w", err)
		}
		c.ownDir = true
	} else if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	c.launch = newLauncher()
	defer func() {
		if err != nil {
			if serr := c.Stop(context.WithoutCancel(ctx)); serr != nil {
				err = fmt.Errorf("%w (and stopping: %v)", err, serr)
			}
		}
	}()
	t0 := time.Now()
	if c.pki, err = newPKI(filepath.Join(c.dir, "pki")); err != nil {
		return nil, err
	}
	if c.users, err = writeTokens(c.pki.path(tokensFile), o.Users); err != nil {
		return nil, err
	}
	if o.ClusterEgress {
		if err = c.startEgress(); err != nil {
			return nil, err
		}
	}
	tPKI := time.Now()

	etcdURL, err := c.startEtcd(ctx, o.BinDir)
	if err != nil {
		return nil, err
	}
	tEtcd := time.Now()
	if err = c.startAPIServer(ctx, o.BinDir, etcdURL, o.ReadyTimeout); err != nil {
		return nil, err
	}
	tAPI := time.Now()
	if err = os.WriteFile(c.AdminKubeconfig(), c.adminKubeconfig(), 0o600); err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	if err = c.createBootstrapRBAC(ctx); err != nil {
		return nil, err
	}
	if o.ControllerManager {
		if err = c.startControllerManager(o.BinDir, o.Workloads); err != nil {
			return nil, err
		}
	}
	c.log.Info("control plane ready", "url", c.url, "dir", c.dir,
		"pki", tPKI.Sub(t0).Round(time.Millisecond), "etcd", tEtcd.Sub(tPKI).Round(time.Millisecond),
		"apiserver", tAPI.Sub(tEtcd).Round(time.Millisecond), "total", time.Since(t0).Round(time.Millisecond))
	return c, nil
}

// startEtcd starts a single-member etcd on two free loopback ports and waits
// for /health; a lost port race is retried with new ports.
func (c *ControlPlane) startEtcd(ctx context.Context, bin string) (string, error) {
	for attempt := 1; ; attempt++ {
		ports, err := FreePorts(2)
		if err != nil {
			return "", fmt.Errorf("kube: etcd: %w", err)
		}
		client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
		peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		dataDir := filepath.Join(c.dir, "etcd")
		if err := os.RemoveAll(dataDir); err != nil {
			return "", fmt.Errorf("kube: etcd: %w", err)
		}
		p, err := start(c.launch, "etcd", filepath.Join(c.dir, "etcd.log"), filepath.Join(bin, "etcd"),
			"--name=rig", "--data-dir="+dataDir,
			"--listen-client-urls="+client, "--advertise-client-urls="+client,
			"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
			"--initial-cluster=rig="+peer,
			// test data only: no fsync, and a 10x faster election than the
			// defaults (healthy in ~0.3 s instead of ~1 s)
			"--unsafe-no-fsync", "--heartbeat-interval=10", "--election-timeout=100",
			"--log-level=warn")
		if err != nil {
			return "", fmt.Errorf("kube: %w", err)
		}
		c.addProc(p)
		err = waitHTTP(ctx, http.DefaultClient, client+"/health", 30*time.Second, p)
		if err == nil {
			return client, nil
		}
		if p.hasExited() && p.bindClash() && attempt < 3 {
			c.log.Warn("etcd lost a port race; retrying", "attempt", attempt)
			c.removeProc(p)
			continue
		}
		return "", fmt.Errorf("kube: etcd: %w", err)
	}
}

func (c *ControlPlane) startAPIServer(ctx context.Context, bin, etcdURL string, timeout time.Duration) error {
	p := c.pki.path
	if err := c.writeAuditPolicy(); err != nil {
		return fmt.Errorf("kube: kube-apiserver: %w", err)
	}
	for attempt := 1; ; attempt++ {
		ports, err := FreePorts(1)
		if err != nil {
			return fmt.Errorf("kube: kube-apiserver: %w", err)
		}
		c.url = "https://127.0.0.1:" + strconv.Itoa(ports[0])
		args := append([]string{
			"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[0]),
			// REQUIRED with a loopback advertise address: the default
			// reconciler refuses 127.0.0.1 and the apiserver exits
			"--endpoint-reconciler-type=none",
			"--etcd-servers=" + etcdURL,
			"--tls-cert-file=" + p(apiserverCertFile), "--tls-private-key-file=" + p(apiserverKeyFile),
			"--client-ca-file=" + p(caCertFile),
			"--token-auth-file=" + p(tokensFile),
			"--enable-bootstrap-token-auth=true",
			"--authorization-mode=Node,RBAC",
			// what a real cluster runs: a node may only touch its own Node
			"--enable-admission-plugins=NodeRestriction",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + p(saPubFile),
			"--service-account-signing-key-file=" + p(saKeyFile),
			"--service-cluster-ip-range=10.0.0.0/24",
			"--allow-privileged=true",
			"--kubelet-client-certificate=" + p(adminCertFile), "--kubelet-client-key=" + p(adminKeyFile),
			// never write into the machine's /var/run/kubernetes
			"--cert-dir=" + filepath.Join(c.dir, "apiserver-certs"),
			"--profiling=false"}, append(c.egressArgs(), c.auditArgs()...)...)
		ap, err := start(c.launch, "kube-apiserver", filepath.Join(c.dir, "kube-apiserver.log"),
			filepath.Join(bin, "kube-apiserver"), args...)
		if err != nil {
			return fmt.Errorf("kube: %w", err)
		}
		c.addProc(ap)
		hc, err := c.httpClient(c.AdminConfig())
		if err != nil {
			return err
		}
		err = waitHTTP(ctx, hc, c.url+"/readyz", timeout, ap)
		if err == nil {
			return nil
		}
		if ap.hasExited() && ap.bindClash() && attempt < 3 {
			c.log.Warn("kube-apiserver lost a port race; retrying", "attempt", attempt)
			c.removeProc(ap)
			continue
		}
		return fmt.Errorf("kube: kube-apiserver: %w", err)
	}
}

// PodCIDR is the cluster CIDR node CIDRs are allocated from (Options.Workloads); each Node gets a /24.
const PodCIDR = "10.214.0.0/16"

func (c *ControlPlane) startControllerManager(bin string, workloads bool) error {
	p := c.pki.path
	// only what TLS bootstrap needs: approve node CSRs, sign them with the
	// cluster CA, clean up old CSRs and expired bootstrap tokens
	controllers := "csrapproving,csrsigning,csrcleaner,tokencleaner"
	var extra []string
	if workloads {
		controllers += ",deployment,replicaset,daemonset,serviceaccount,nodeipam,disruption"
		extra = []string{"--allocate-node-cidrs=true", "--cluster-cidr=" + PodCIDR, "--node-cidr-mask-size=24",
			"--service-cluster-ip-range=10.0.0.0/24"}
	}
	args := append([]string{
		"--kubeconfig=" + c.AdminKubeconfig(),
		"--controllers=" + controllers,
		"--cluster-signing-cert-file=" + p(caCertFile), "--cluster-signing-key-file=" + p(caKeyFile),
		"--leader-elect=false", "--use-service-account-credentials=false",
		// no HTTPS endpoint at all: nothing here probes it, and no port can clash
		"--secure-port=0", "--bind-address=127.0.0.1"}, extra...)
	cm, err := start(c.launch, "kube-controller-manager", filepath.Join(c.dir, "kube-controller-manager.log"),
		filepath.Join(bin, "kube-controller-manager"), args...)
	if err != nil {
		return fmt.Errorf("kube: %w", err)
	}
	c.addProc(cm)
	// A bad flag shows up within a second; anything later is the caller's
	// to see (a CSR that stays pending, with ComponentLog in the message).
	select {
	case <-cm.exited:
		return fmt.Errorf("kube: %w", cm.exitError())
	case <-time.After(500 * time.Millisecond):
	}
	return nil
}

func (c *ControlPlane) addProc(p *proc) {
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
}

func (c *ControlPlane) removeProc(p *proc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, q := range c.procs {
		if q == p {
			c.procs = append(c.procs[:i], c.procs[i+1:]...)
			return
		}
	}
}

// waitHTTP polls url until it answers 200, p exits, timeout passes or ctx ends.
func waitHTTP(ctx context.Context, hc *http.Client, url string, timeout time.Duration, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-p.exited:
			return p.exitError()
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v (last: %v); last lines of %s:\n%s", timeout, last, p.logPath, p.tail(30))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *ControlPlane) httpClient(cfg *rest.Config) (*http.Client, error) {
	tr, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kube: client transport: %w", err)
	}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}, nil
}

// Stop ends kube-controller-manager, kube-apiserver and etcd, in that order:
// SIGTERM to each process group, SIGKILL after 10 s or when ctx ends. It
// waits for every process and removes Dir if Start created it. Calling it
// again returns the first result.
func (c *ControlPlane) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		procs := append([]*proc(nil), c.procs...)
		c.mu.Unlock()
		var errs []error
		t0 := time.Now()
		for i := len(procs) - 1; i >= 0; i-- {
			if err := procs[i].stop(ctx, 10*time.Second); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			// only now: ending the launcher's thread fires Pdeathsig
			c.launch.close()
		}
		if err := c.closeEgress(); err != nil {
			errs = append(errs, err)
		}
		c.log.Info("control plane stopped", "took", time.Since(t0).Round(time.Millisecond))
		if c.ownDir && len(errs) == 0 && os.Getenv("KUBESLOT_KEEP_KUBE_DIR") != "1" {
			if err := os.RemoveAll(c.dir); err != nil {
				errs = append(errs, fmt.Errorf("kube: remove %s: %w", c.dir, err))
			}
		}
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}

// URL is the apiserver's address, https://127.0.0.1:PORT.
func (c *ControlPlane) URL() string { return c.url }

// Dir is the work directory: pki/, etcd/, *.log.
func (c *ControlPlane) Dir() string { return c.dir }

// CAPEM is the cluster CA certificate: it signed the apiserver's serving
// certificate and every client certificate, kubelets' included.
func (c *ControlPlane) CAPEM() []byte { return append([]byte(nil), c.pki.caPEM...) }

// ComponentLog returns the last n lines of a component's log ("etcd",
// "kube-apiserver", "kube-controller-manager"), for failure messages.
func (c *ControlPlane) ComponentLog(name string, n int) string {
	return logTail(filepath.Join(c.dir, name+".log"), n)
}

// CheckRunning returns an error naming the components that have exited (nil
// when all run), for a test that wonders why the cluster stopped answering.
func (c *ControlPlane) CheckRunning() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var dead []string
	for _, p := range c.procs {
		if p.hasExited() {
			dead = append(dead, p.name)
		}
	}
	if len(dead) > 0 {
		return fmt.Errorf("kube: exited: %s", strings.Join(dead, ", "))
	}
	return nil
}

// PID is the process ID of a running component ("etcd", "kube-apiserver",
// "kube-controller-manager"), or 0 when it is not running: benchmarks read
// its CPU time and resident memory from /proc.
func (c *ControlPlane) PID(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.name == name && !p.hasExited() {
			return p.cmd.Process.Pid
		}
	}
	return 0
}
