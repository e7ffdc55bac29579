package kube

import (
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/integration/netfwd"
)

func TestEgressRoutes(t *testing.T) {
	c := &ControlPlane{dir: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	if _, err := c.RouteEgress(netip.MustParseAddr("10.213.1.2"), func() (string, error) { return "", nil }); err == nil {
		t.Fatal("RouteEgress without ClusterEgress succeeded")
	}
	if err := c.startEgress(); err != nil {
		t.Fatal(err)
	}
	defer c.closeEgress()
	cfg, err := os.ReadFile(filepath.Join(c.dir, egressConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"apiVersion: apiserver.k8s.io/v1beta1\n", "kind: EgressSelectorConfiguration\n",
		"- name: cluster\n", "proxyProtocol: HTTPConnect\n", "udsName: " + filepath.Join(c.dir, egressSocketFile) + "\n"} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	nodeNS := func() (string, error) { return "/proc/4242/ns/net", nil }
	remove, err := c.RouteEgress(netip.MustParseAddr("10.213.1.2"), nodeNS, "Node-A")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RouteEgress(netip.MustParseAddr("10.213.9.2"), nodeNS, "node-a"); err == nil {
		t.Error("a name was routed twice")
	}
	for host, want := range map[string]string{
		"10.213.1.2": "/proc/4242/ns/net 10.213.1.2", "node-a": "/proc/4242/ns/net 10.213.1.2",
		"NODE-A.": "/proc/4242/ns/net 10.213.1.2", "::ffff:10.213.1.2": "/proc/4242/ns/net 10.213.1.2",
		"127.0.0.1": " 127.0.0.1", "localhost": " 127.0.0.1", "::1": " ::1",
	} {
		ns, ip, err := c.egress.route(host)
		if err != nil || ns+" "+ip != want {
			t.Errorf("route(%s) = %q %q %v, want %q", host, ns, ip, err, want)
		}
	}
	remove()
	remove()
	for _, host := range []string{"10.213.1.2", "node-a", "192.0.2.1", "example.com"} {
		if _, _, err := c.egress.route(host); !errors.Is(err, netfwd.ErrNoRoute) {
			t.Errorf("route(%s) after remove: %v, want ErrNoRoute", host, err)
		}
	}
	if args := strings.Join(c.egressArgs(), " "); !strings.Contains(args, "--egress-selector-config-file="+filepath.Join(c.dir, egressConfigFile)) ||
		!strings.Contains(args, "--kubelet-preferred-address-types=InternalIP") {
		t.Errorf("egressArgs: %s", args)
	}
}
