package hostprep

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// cniChainPrefix names the firewall chains CNI plugins (bridge with ipMasq,
// portmap) create.
const cniChainPrefix = "CNI-"

// RemovePodNetwork deletes link and every CNI-* chain of the nat, filter and
// mangle tables (IPv4 and IPv6), after deleting the rules of other chains
// that jump to them. A missing link, table or tool is nothing to undo.
func (s ExecSystem) RemovePodNetwork(ctx context.Context, link string) error {
	if err := s.check(); err != nil {
		return err
	}
	if link == "" || strings.ContainsAny(link, " /\t\n") {
		return fmt.Errorf("remove pod network: link %q is not an interface name", link)
	}
	if out, err := run(ctx, DefaultCommandTimeout, nil, "ip", "link", "show", link); err == nil {
		if _, err := run(ctx, DefaultCommandTimeout, nil, "ip", "link", "delete", link); err != nil {
			return fmt.Errorf("remove pod network link %s: %w", link, err)
		}
	} else if !strings.Contains(string(out), "does not exist") && !strings.Contains(err.Error(), "does not exist") {
		return fmt.Errorf("remove pod network link %s: %w", link, err)
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		for _, table := range []string{"nat", "filter", "mangle"} {
			out, err := run(ctx, DefaultCommandTimeout, nil, tool, "-w", "5", "-t", table, "-S")
			if err != nil {
				continue // a table this kernel or tool does not have
			}
			jumps, chains := cniRules(string(out))
			for _, rule := range jumps {
				if _, err := run(ctx, DefaultCommandTimeout, nil, tool, append([]string{"-w", "5", "-t", table, "-D"}, rule...)...); err != nil {
					return fmt.Errorf("remove pod network: %s -t %s -D %s: %w", tool, table, strings.Join(rule, " "), err)
				}
			}
			for _, op := range []string{"-F", "-X"} {
				for _, c := range chains {
					if _, err := run(ctx, DefaultCommandTimeout, nil, tool, "-w", "5", "-t", table, op, c); err != nil {
						return fmt.Errorf("remove pod network: %s -t %s %s %s: %w", tool, table, op, c, err)
					}
				}
			}
		}
	}
	return nil
}

// cniRules reads `iptables -S` output: the rules of non-CNI chains that
// jump to a CNI chain (as arguments for -D, without "-A"), and the CNI
// chains. Rules inside CNI chains go with their chain.
func cniRules(save string) (jumps [][]string, chains []string) {
	for _, l := range strings.Split(save, "\n") {
		f := splitRule(l)
		switch {
		case len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], cniChainPrefix):
			chains = append(chains, f[1])
		case len(f) > 2 && f[0] == "-A" && !strings.HasPrefix(f[1], cniChainPrefix):
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && strings.HasPrefix(f[i+1], cniChainPrefix) {
					jumps = append(jumps, f[1:])
					break
				}
			}
		}
	}
	return jumps, chains
}

// splitRule splits one line of `iptables -S` into arguments: blanks
// separate them, except inside double quotes, where \" and \\ stand for
// themselves (how iptables prints a comment).
func splitRule(l string) []string {
	var out []string
	var cur strings.Builder
	in, have := false, false
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case in && c == '\\' && i+1 < len(l) && (l[i+1] == '"' || l[i+1] == '\\'):
			i++
			cur.WriteByte(l[i])
		case c == '"':
			in, have = !in, true
		case !in && (c == ' ' || c == '\t'):
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}
