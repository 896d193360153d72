package clusterset

import (
	"strings"
	"testing"
)

// kubeadm's Corefile, as kind's clusters have it.
const kubeadmCorefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
`

func TestCorefile(t *testing.T) {
	out, changed, err := Corefile(kubeadmCorefile)
	if err != nil || !changed {
		t.Fatalf("changed %v, err %v", changed, err)
	}
	for _, want := range []string{
		"    kubernetes cluster.local clusterset.local in-addr.arpa ip6.arpa {\n       multicluster clusterset.local\n       pods insecure\n",
		"       disable success cluster.local clusterset.local\n       disable denial cluster.local clusterset.local\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no\n%s\nin\n%s", want, out)
		}
	}
	// Once is enough: the same Corefile again changes nothing.
	again, changed, err := Corefile(out)
	if err != nil || changed || again != out {
		t.Errorf("second pass: changed %v, err %v", changed, err)
	}
	// A kubernetes plugin without zones or block.
	out, _, err = Corefile(".:53 {\n  kubernetes\n  forward . 1.1.1.1\n}\n")
	if err != nil || !strings.Contains(out, "  kubernetes cluster.local clusterset.local {\n     multicluster clusterset.local\n  }\n  forward") {
		t.Errorf("bare plugin: %v\n%s", err, out)
	}
	for _, bad := range []string{".:53 {\n  forward . 1.1.1.1\n}\n", ".:53 {\n kubernetes a.local\n}\nb:53 {\n kubernetes b.local\n}\n"} {
		if _, changed, err := Corefile(bad); err == nil || changed {
			t.Errorf("%q: changed %v, err %v", bad, changed, err)
		}
	}
}
