package node

// The node network of the rig: a host with its own network namespace and a node IP (sdhost NodeNetwork), the
// apiserver reached from inside it through a forwarder (netfwd.Forward), and the apiserver reaching a server on the
// node IP through its cluster egress (kube ClusterEgress + RouteEgress), as it reaches a kubelet for logs, exec and
// port-forward. The machine's own network namespace must not change.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/netfwd"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
)

// machineNetState is the machine's own addresses, links, routes and policy rules (IPv4 and IPv6), from `ip`.
func machineNetState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"-o", "link"}, {"-o", "addr"}, {"route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"},
		{"rule"}, {"-6", "rule"}, {"-o", "netconf"},
	} {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		fmt.Fprintf(&b, "## ip %s\n", strings.Join(args, " "))
		for _, l := range strings.Split(string(out), "\n") {
			// link statistics and address lifetimes tick; neither is a change made by the rig
			if i := strings.Index(l, "valid_lft"); i >= 0 {
				l = l[:i]
			}
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// selfSignedTLS is a throwaway serving certificate for ip (kube-apiserver has no kubelet CA: it does not verify).
func selfSignedTLS(t *testing.T, ip netip.Addr) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rig-net-node"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{ip.AsSlice()}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

func TestHostNodeNetwork(t *testing.T) {
	rig.NeedCluster(t) // the rig and the kube binaries are here (the shared cluster itself is not used)
	before := machineNetState(t)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	t0 := time.Now()
	cp, err := kube.Start(ctx, kube.Options{BinDir: rig.KubeBinDir, Log: rig.HostLog(t), ClusterEgress: true})
	if err != nil {
		t.Fatal(err)
	}
	rig.Timing(t, "control plane with cluster egress ready", time.Since(t0))
	t.Cleanup(func() {
		if err := cp.Stop(context.Background()); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	apiserver, err := url.Parse(cp.URL())
	if err != nil {
		t.Fatal(err)
	}

	name := rig.HostName("rig-net")
	h := rig.StartHost(t, sdhost.Options{Name: name, NodeNetwork: true})
	nodeIP := h.NodeIP()
	ns, err := h.NetNS()
	if err != nil {
		t.Fatal(err)
	}
	if same, err := netfwd.SameNamespace(ns, ""); err != nil || same {
		t.Fatalf("host's network namespace is the machine's (%v, %v)", same, err)
	}
	pid := fmt.Sprint(h.PID())
	out, err := exec.Command("nsenter", "-t", pid, "-n", "ip", "-o", "addr", "show", "dev", sdhost.NodeLink).CombinedOutput()
	if err != nil || !strings.Contains(string(out), " "+nodeIP.String()+"/24 ") {
		t.Fatalf("host's %s: %v: %s", sdhost.NodeLink, err, out)
	}
	t.Logf("host pid %d: node IP %s on %s, netns %s", h.PID(), nodeIP, sdhost.NodeLink, ns)

	// 1. host -> apiserver: a forwarder on the apiserver's own address inside the host's namespace, so the URL and
	// the serving certificate are the same on both sides. curl runs fully inside the host (all its namespaces).
	fwd, err := netfwd.Forward(ns, apiserver.Host, "", apiserver.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	if err := h.WriteFile("/etc/rig-net/ca.pem", cp.CAPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	out, err = exec.Command("nsenter", "-t", pid, "-a", "curl", "-sS", "--max-time", "10", "--cacert", "/etc/rig-net/ca.pem",
		cp.URL()+"/readyz").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("curl %s/readyz inside the host: %v: %s", cp.URL(), err, out)
	}
	rig.Timing(t, "host -> apiserver through the forwarder (curl, incl. fork)", time.Since(t1))
	if fwd.Accepted() < 1 {
		t.Errorf("forwarder accepted %d connections", fwd.Accepted())
	}

	// 2. apiserver -> "kubelet": an HTTPS server on the node IP inside the host's namespace, reached through the node
	// proxy subresource, which the apiserver dials like logs/exec/port-forward (kubelet transport, cluster egress).
	l, err := netfwd.Listen(ns, "tcp", net.JoinHostPort(nodeIP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "node %s says hi to %s", nodeIP, r.URL.Path)
		}),
		TLSConfig: selfSignedTLS(t, nodeIP),
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.ServeTLS(l, "", "")
	}()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})

	admin, err := kubernetes.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	mkNode := func(name string, ip netip.Addr) {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}, {Type: corev1.NodeHostName, Address: name}}
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const node = "rig-net-node"
	mkNode(node, nodeIP)
	remove, err := cp.RouteEgress(nodeIP, h.NetNS, node)
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	proxyGet := func(name string, path ...string) (string, error) {
		if len(path) == 0 {
			path = []string{"hello"}
		}
		body, err := admin.CoreV1().RESTClient().Get().AbsPath(append([]string{"/api/v1/nodes", name, "proxy"}, path...)...).DoRaw(ctx)
		return string(body), err
	}
	t2 := time.Now()
	body, err := proxyGet(node)
	if want := fmt.Sprintf("node %s says hi to /hello", nodeIP); err != nil || body != want {
		t.Fatalf("GET nodes/%s/proxy/hello: %q, %v; want %q\n%s", node, body, err, want, cp.ComponentLog("kube-apiserver", 20))
	}
	rig.Timing(t, "apiserver -> node IP through cluster egress (node proxy)", time.Since(t2))

	// The same from a process in the host: python's http.server on NODE_IP:10250, started with nsenter into the
	// host's network and mount namespaces (not its pid namespace: a process there whose parent is outside keeps the
	// namespace from ending until reaped), reached as http://node:10250 through the node proxy (the apiserver's
	// proxy transport, also cluster egress). Ended before the host stops.
	if err := h.WriteFile("/srv/rig-net/hello.txt", []byte("hello from inside the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	py := exec.Command("nsenter", "-t", pid, "-n", "-m", "/usr/bin/python3", "-m", "http.server", "--bind", nodeIP.String(),
		"--directory", "/srv/rig-net", "10250")
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	stopPy := func() {
		if py.ProcessState == nil {
			_ = py.Process.Kill()
			_ = py.Wait()
		}
	}
	t.Cleanup(stopPy)
	kubeletAddr := net.JoinHostPort(nodeIP.String(), "10250")
	for deadline := time.Now().Add(20 * time.Second); ; {
		c, err := netfwd.Dial(ctx, ns, "tcp", kubeletAddr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("python http.server in the host never listened on %s: %v", kubeletAddr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	body, err = proxyGet("http:"+node+":10250", "hello.txt")
	if err != nil || body != "hello from inside the host\n" {
		t.Fatalf("GET nodes/http:%s:10250/proxy/hello.txt: %q, %v", node, body, err)
	}
	stopPy()

	// A node whose IP no route names is refused by the egress proxy: nothing is dialed from the machine.
	mkNode("rig-net-unrouted", netip.MustParseAddr("10.213.251.2"))
	if body, err := proxyGet("rig-net-unrouted"); err == nil || !strings.Contains(body, "code 403") {
		t.Errorf("GET through an unrouted node: %q, %v; want the egress proxy's 403", body, err)
	}

	// 3. After everything is gone, the machine's namespace is as it was.
	srv.Close()
	<-served
	fwd.Close()
	remove()
	rig.StopHost(t, h, name)
	if err := cp.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := machineNetState(t); after != before {
		t.Errorf("the machine's network namespace changed:\n--- before\n%s\n--- after\n%s", before, after)
	}
}

// TestHostNodeNetworkAcrossBoots: every boot is a new network namespace, and each gets the node IP again.
func TestHostNodeNetworkAcrossBoots(t *testing.T) {
	name := rig.HostName("rig-net-boots")
	h := rig.StartHost(t, sdhost.Options{Name: name, NodeNetwork: true, Persistent: true})
	hasIP := func() string {
		t.Helper()
		out, err := exec.Command("nsenter", "-t", fmt.Sprint(h.PID()), "-n", "ip", "-o", "-4", "addr", "show", "dev", sdhost.NodeLink).CombinedOutput()
		if err != nil || !strings.Contains(string(out), " "+h.NodeIP().String()+"/24 ") {
			t.Fatalf("boot with pid %d: %v: %s", h.PID(), err, out)
		}
		ns, err := h.NetNS()
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	first := hasIP()
	if err := h.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.NetNS(); err == nil {
		t.Error("NetNS of a killed host")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := h.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	if second := hasIP(); second == first {
		t.Errorf("second boot has the same namespace path %s", second)
	}
}
