package clusterset

import (
	"fmt"
	"regexp"
	"strings"
)

// Zone is the clusterset's DNS zone (KEP 1645).
const Zone = "clusterset.local"

var (
	kubernetesLine = regexp.MustCompile(`(?m)^([ \t]*)kubernetes([ \t]+[^{\n]*?)?[ \t]*(\{)?[ \t]*$`)
	disableLine    = regexp.MustCompile(`(?m)^([ \t]*disable[ \t]+(success|denial)[ \t]+[^\n]*?)[ \t]*$`)
)

// Corefile adds the clusterset zone to a CoreDNS Corefile: the zone beside
// the others of its kubernetes plugin, the multicluster option inside its
// block (CoreDNS 1.12.2 and later then answer NAME.NS.svc.clusterset.local
// from ServiceImports), and the zone in the cache plugin's disable lines,
// so an import that appears or moves is seen at once. It reports whether
// it changed anything: a Corefile that has the option is left as it is.
func Corefile(in string) (string, bool, error) {
	if strings.Contains(in, "multicluster "+Zone) {
		return in, false, nil
	}
	switch n := len(kubernetesLine.FindAllStringIndex(in, -1)); n {
	case 0:
		return in, false, fmt.Errorf("the Corefile has no kubernetes plugin line to add zone %s to", Zone)
	case 1:
	default:
		return in, false, fmt.Errorf("the Corefile has %d kubernetes plugin lines: add zone %s and `multicluster %s` to the right one by hand", n, Zone, Zone)
	}
	loc := kubernetesLine.FindStringSubmatchIndex(in)
	indent := in[loc[2]:loc[3]]
	zones := ""
	if loc[4] >= 0 {
		zones = strings.TrimSpace(in[loc[4]:loc[5]])
	}
	fields := strings.Fields(zones)
	if len(fields) == 0 {
		// No zone: the server block's. Name cluster.local's explicitly,
		// first, as it stays the primary one.
		fields = []string{"cluster.local"}
	}
	fields = append(fields[:1:1], append([]string{Zone}, fields[1:]...)...)
	line := indent + "kubernetes " + strings.Join(fields, " ") + " {\n" + indent + "   multicluster " + Zone
	if loc[6] < 0 {
		line += "\n" + indent + "}"
	}
	out := in[:loc[0]] + line + in[loc[1]:]
	out = disableLine.ReplaceAllStringFunc(out, func(l string) string {
		if strings.Contains(l, Zone) || !strings.Contains(l, "cluster.local") {
			return l
		}
		return strings.TrimRight(l, " \t") + " " + Zone
	})
	return out, true, nil
}
