package hostprep

import (
	"slices"
	"strings"
	"testing"
)

// TestCNIRules: the jumps from other chains to CNI chains, comments kept as
// one argument, and the CNI chains themselves; rules inside CNI chains and
// other chains' rules are left alone.
func TestCNIRules(t *testing.T) {
	save := `-P PREROUTING ACCEPT
-P POSTROUTING ACCEPT
-N CNI-HOSTPORT-DNAT
-N CNI-DN-1234
-N KUBE-OTHER
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -s 10.214.0.5/32 -m comment --comment "name: \"kubeslot-bridge\" id: \"abc\"" -j CNI-5f2
-A POSTROUTING -j KUBE-OTHER
-A CNI-HOSTPORT-DNAT -p tcp -j CNI-DN-1234
-A CNI-DN-1234 -p tcp --dport 18080 -j DNAT --to-destination 10.214.0.5:8080
`
	jumps, chains := cniRules(save)
	if !slices.Equal(chains, []string{"CNI-HOSTPORT-DNAT", "CNI-DN-1234"}) {
		t.Errorf("chains %q", chains)
	}
	var got []string
	for _, j := range jumps {
		got = append(got, strings.Join(j, "|"))
	}
	want := []string{
		"PREROUTING|-m|addrtype|--dst-type|LOCAL|-j|CNI-HOSTPORT-DNAT",
		"OUTPUT|-m|addrtype|--dst-type|LOCAL|-j|CNI-HOSTPORT-DNAT",
		`POSTROUTING|-s|10.214.0.5/32|-m|comment|--comment|name: "kubeslot-bridge" id: "abc"|-j|CNI-5f2`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("jumps\n%q\nwant\n%q", got, want)
	}
}
