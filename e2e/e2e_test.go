//go:build e2e

// Package e2e runs hoplink as users meet it: kind clusters (node image built
// here from Debian packages and Go modules, hack/kind/node-image.sh), the
// hoplink image, the Helm chart, config/samples, then traffic.
//
//	make e2e            # or: go test -tags e2e -v -timeout 40m ./e2e
//
// E2E_KEEP=1 keeps the clusters for a look afterwards.
package e2e

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	root      string // the repository
	kindBin   string
	kubectl   string
	helmBin   string
	nodeImage string
	work      string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	wd, _ := os.Getwd()
	root = filepath.Dir(wd)
	// Skipped where it cannot run, except in CI, where a skip would hide it.
	skip := 0
	if os.Getenv("CI") != "" {
		skip = 1
	}
	if os.Getuid() != 0 {
		fmt.Println("e2e: skipped: needs root (a Docker engine and kind clusters)")
		return skip
	}
	if out, err := command(root, "hack/dockerd.sh"); err != nil {
		fmt.Printf("e2e: skipped: no Docker engine here (%s)\n", strings.TrimSpace(out))
		return skip
	}
	var err error
	step := func(what string, f func() error) bool {
		start := time.Now()
		if err = f(); err != nil {
			fmt.Printf("e2e: %s: %v\n", what, err)
			return false
		}
		fmt.Printf("e2e: %s (%s)\n", what, time.Since(start).Round(time.Second))
		return true
	}
	if !step("node image", func() error {
		out, err := command(root, "hack/kind/node-image.sh")
		nodeImage = lastLine(out)
		return wrap(err, out)
	}) || !step("hoplink image", func() error {
		out, err := command(root, "hack/docker-build.sh")
		return wrap(err, out)
	}) || !step("app image", func() error {
		out, err := command(root, "bash", "-c", appImageScript)
		return wrap(err, out)
	}) || !step("helm", func() error {
		out, err := command(root, "hack/helm.sh")
		helmBin = lastLine(out)
		return wrap(err, out)
	}) {
		return 1
	}
	kindBin = filepath.Join(root, "bin/kind/kind-v0.33.0/kind")
	kubectl = filepath.Join(root, "bin/kind/k8s-1.37.1/kubectl")
	if work, err = os.MkdirTemp("", "hoplink-e2e"); err != nil {
		fmt.Println(err)
		return 1
	}
	defer os.RemoveAll(work)
	return m.Run()
}

func wrap(err error, out string) error {
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// command runs a command in dir and returns its combined output.
func command(dir string, argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func sh(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := command(root, argv...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return out
}

// eventually retries f until it succeeds or d passes.
func eventually(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(time.Second)
	}
}

// cluster is one kind cluster.
type cluster struct {
	name, kubeconfig string
	family           string // kind's networking.ipFamily: ipv4, ipv6 or dual
	reused           bool   // E2E_REUSE found it running
}

// IP families, as kind and the relays' metrics name them.
const (
	ipv4 = "ipv4"
	ipv6 = "ipv6"
	dual = "dual"
)

// families are the IP families of c's nodes, pods and Services.
func (c *cluster) families() []string {
	if c.family == dual {
		return []string{ipv4, ipv6}
	}
	return []string{c.family}
}

// newCluster creates a kind cluster of one control-plane node and a worker
// per extra site; each node is labelled hoplink.dev/site. family is kind's
// networking.ipFamily (ipv4, ipv6 or dual); the node image's pod network
// (hoplink-pod-network) gives pods the families named in
// /etc/hoplink/pod-families, mounted here into each node.
func newCluster(t *testing.T, name, family string, sites ...string) *cluster {
	t.Helper()
	c := &cluster{name: name, kubeconfig: filepath.Join(work, name+".kubeconfig"), family: family}
	podFamilies := writeWork(t, name+".pod-families", strings.Join(c.families(), " ")+"\n")
	var cfg strings.Builder
	fmt.Fprintf(&cfg, `kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking: {disableDefaultCNI: true, ipFamily: %s}
kubeadmConfigPatches:
- |
  kind: ClusterConfiguration
  imageRepository: hoplink.local
- |
  kind: KubeletConfiguration
  failCgroupV1: false
nodes:
`, family)
	for i, s := range sites {
		role := "worker"
		if i == 0 {
			role = "control-plane"
		}
		fmt.Fprintf(&cfg, "- role: %s\n  image: %s\n  labels: {hoplink.dev/site: %s}\n", role, nodeImage, s)
		fmt.Fprintf(&cfg, "  extraMounts: [{hostPath: %s, containerPath: /etc/hoplink/pod-families, readOnly: true}]\n", podFamilies)
	}
	path := filepath.Join(work, name+".kind.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("E2E_REUSE") != "" && c.exists() {
		// make mcs-conformance after E2E_KEEP=1 make e2e: the clusters as
		// they are; every step below is safe to repeat.
		t.Logf("reusing cluster %s", name)
		out := sh(t, kindBin, "get", "kubeconfig", "--name", name)
		if err := os.WriteFile(c.kubeconfig, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		sh(t, kindBin, "load", "docker-image", "hoplink:dev", appImage, "--name", name)
		c.reused = true
		return c
	}
	deleteCluster(name) // a leftover of an interrupted run
	if family != ipv4 {
		if err := ensureIPv6Network(); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	create := []string{kindBin, "create", "cluster", "--name", name, "--config", path, "--kubeconfig", c.kubeconfig, "--wait", "180s"}
	if out, err := command(root, create...); err != nil {
		// kind's node setup fails now and then before anything of ours
		// runs (a worker's kubeadm join read a config not yet written):
		// one more try, said in the log, rather than a failed run.
		t.Logf("kind create cluster %s failed, trying once more: %v\n%s", name, err, lastLines(out, 5))
		deleteCluster(name)
		sh(t, create...)
	}
	t.Logf("cluster %s with %d nodes up in %s", name, len(sites), time.Since(start).Round(time.Second))
	t.Cleanup(func() {
		if os.Getenv("E2E_KEEP") != "" || os.Getenv("E2E_REUSE") != "" {
			t.Logf("keeping cluster %s (kubeconfig %s)", name, c.kubeconfig)
			return
		}
		if err := deleteCluster(name); err != nil {
			t.Errorf("delete cluster %s: %v", name, err)
		}
	})
	// Relays run on every node, the control plane's included.
	if out, err := c.try("taint", "nodes", "-l", "node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/control-plane-"); err != nil && !strings.Contains(out, "not found") {
		t.Fatalf("untaint the control plane: %v: %s", err, out)
	}
	sh(t, kindBin, "load", "docker-image", "hoplink:dev", appImage, "--name", name)
	return c
}

// appImage is the e2e's workload (e2e/app), FROM scratch.
const appImage = "hoplink-e2e-app:dev"

const appImageScript = `set -e
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
CGO_ENABLED=0 go build -trimpath -o "$d/app" ./e2e/app
tar -C "$d" -c app | docker import --change 'ENTRYPOINT ["/app"]' - ` + appImage + ` >/dev/null`

// deleteCluster deletes a kind cluster. On cgroup v1 a node killed while its
// runc was starting a pod leaves that pod's cgroup frozen, and a frozen
// process cannot die, so Docker cannot remove the node: thaw first.
func deleteCluster(name string) error {
	var err error
	for range 3 {
		ids, _ := command(root, "docker", "ps", "-aq", "--no-trunc", "--filter", "label=io.x-k8s.kind.cluster="+name)
		for _, id := range strings.Fields(ids) {
			filepath.WalkDir(filepath.Join("/sys/fs/cgroup/freezer/docker", id), func(p string, d os.DirEntry, err error) error {
				if err == nil && d.Name() == "freezer.state" {
					if b, _ := os.ReadFile(p); strings.TrimSpace(string(b)) == "FROZEN" {
						os.WriteFile(p, []byte("THAWED"), 0o644)
					}
				}
				return nil
			})
		}
		var out string
		if out, err = command(root, kindBin, "delete", "cluster", "--name", name); err == nil {
			return nil
		}
		err = fmt.Errorf("%w: %s", err, out)
	}
	return err
}

func (c *cluster) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	return sh(t, append([]string{kubectl, "--kubeconfig", c.kubeconfig}, args...)...)
}

func (c *cluster) try(args ...string) (string, error) {
	return command(root, append([]string{kubectl, "--kubeconfig", c.kubeconfig}, args...)...)
}

func (c *cluster) apply(t *testing.T, ns, yaml string) {
	t.Helper()
	cmd := exec.Command(kubectl, "--kubeconfig", c.kubeconfig, "-n", ns, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(yaml)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apply: %v\n%s\n%s", err, out, yaml)
	}
}

// namespace creates a namespace (unless it exists) with the labels given
// as KEY=VALUE.
func (c *cluster) namespace(t *testing.T, name string, labels ...string) {
	t.Helper()
	if _, err := c.try("get", "namespace", name); err != nil {
		c.kubectl(t, "create", "namespace", name)
	}
	if len(labels) > 0 {
		c.kubectl(t, append([]string{"label", "--overwrite", "namespace", name}, labels...)...)
	}
}

// writeWork writes a file into the test's work directory and returns its path.
func writeWork(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(work, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// exists reports whether a kind cluster of c's name runs.
func (c *cluster) exists() bool {
	out, err := command(root, kindBin, "get", "clusters")
	return err == nil && slices.Contains(strings.Fields(out), c.name)
}

// helmInstall installs the chart, or upgrades a reused cluster's release.
func (c *cluster) helmInstall(t *testing.T, args ...string) {
	t.Helper()
	sh(t, append([]string{helmBin, "--kubeconfig", c.kubeconfig, "upgrade", "--install", "hoplink", "charts/hoplink",
		"-n", "hoplink-system", "--create-namespace", "--set", "image.tag=dev,image.pullPolicy=Never", "--wait", "--timeout", "3m"}, args...)...)
	if c.reused {
		// The image loaded is new under the same tag: its pods start again.
		c.kubectl(t, "-n", "hoplink-system", "rollout", "restart", "deployment", "hoplink-operator")
		c.kubectl(t, "-n", "hoplink-system", "rollout", "status", "deployment", "hoplink-operator", "--timeout", "3m")
		c.kubectl(t, "delete", "pods", "-A", "-l", "app.kubernetes.io/component=relay", "--wait=false")
	}
}

// nodeIP is the address of the family given (ipv4, ipv6) of the node of a
// site on the kind network (a dual-stack node has one of each).
func (c *cluster) nodeIP(t *testing.T, site, family string) string {
	t.Helper()
	out := c.kubectl(t, "get", "nodes", "-l", "hoplink.dev/site="+site,
		"-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`)
	for _, f := range strings.Fields(out) {
		if familyOf(f) == family {
			return f
		}
	}
	t.Fatalf("node of site %s has no %s InternalIP: %q", site, family, out)
	return ""
}

// familyOf is the IP family of an address or host:port, "" if neither.
func familyOf(s string) string {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		s = ap.Addr().String()
	}
	a, err := netip.ParseAddr(s)
	switch {
	case err != nil:
		return ""
	case a.Is4() || a.Is4In6():
		return ipv4
	default:
		return ipv6
	}
}

// ensureIPv6Network makes sure kind's Docker network "kind" has IPv6, which
// kind gives it only when it creates it: an IPv4-only one that no container
// uses (left by kind on an engine without IPv6, or made by hand) is deleted
// for kind to make again.
func ensureIPv6Network() error {
	out, err := command(root, "docker", "network", "inspect", "kind", "-f", "{{.EnableIPv6}} {{len .Containers}}")
	if err != nil {
		return nil // none yet: kind creates it with IPv6 where the engine can
	}
	f := strings.Fields(out)
	if len(f) == 2 && f[0] == "true" {
		return nil
	}
	if len(f) == 2 && f[1] == "0" {
		if out, err := command(root, "docker", "network", "rm", "kind"); err != nil {
			return fmt.Errorf("docker network rm kind (IPv4 only): %v: %s", err, out)
		}
		return nil
	}
	return fmt.Errorf("Docker network kind has no IPv6 and containers use it (%s): delete their clusters first", strings.TrimSpace(out))
}

func (c *cluster) nodeContainer(t *testing.T, site string) string {
	t.Helper()
	return strings.TrimSpace(c.kubectl(t, "get", "nodes", "-l", "hoplink.dev/site="+site, "-o", "jsonpath={.items[0].metadata.name}"))
}

// onNode runs a bash script on a node (the node containers have bash and
// coreutils, which is all the clients below need).
func onNode(node, script string) (string, error) {
	return command(root, "docker", "exec", node, "bash", "-c", script)
}

// httpToTLS sends a plain HTTP request to addr from node and returns the
// answer: through a Tunnel whose target is a Kubernetes API server, that
// server's "Client sent an HTTP request to an HTTPS server" proves the bytes
// crossed the chain both ways.
func httpToTLS(node, host string, port int) (string, error) {
	return onNode(node, fmt.Sprintf(`exec 3<>/dev/tcp/%s/%d && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3`, host, port))
}

const httpsAnswer = "Client sent an HTTP request to an HTTPS server"

// dnsQuery sends a DNS query for kubernetes.default.svc.cluster.local (A)
// over UDP from node and returns the answer's bytes, hex.
func dnsQuery(node, host string, port int) (string, error) {
	q := `\x4e\x21\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x0akubernetes\x07default\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01`
	// printf would write the query in pieces (bash flushes at NUL bytes),
	// each its own datagram: cat sends the file in one write.
	return onNode(node, fmt.Sprintf(`printf '%s' >/tmp/dnsq && exec 3<>/dev/udp/%s/%d && cat /tmp/dnsq >&3 && timeout 5 dd bs=512 count=1 <&3 2>/dev/null | od -An -tx1 | tr -d ' \n'`, q, host, port))
}

// chainStatus reads a Chain's status.
type chainStatus struct {
	Route []string `json:"route"`
}

func (c *cluster) chain(t *testing.T, ns, name string) chainStatus {
	t.Helper()
	var ch struct {
		Status chainStatus `json:"status"`
	}
	json.Unmarshal([]byte(c.kubectl(t, "-n", ns, "get", "chain", name, "-o", "json")), &ch)
	return ch.Status
}

func TestClusters(t *testing.T) {
	// Cluster A carries the samples' four sites; cluster B one more relay.
	// Both are dual-stack: nodes, pods and Services have an address of each
	// family, and the checks below use both.
	a := newCluster(t, "hoplink-a", dual, "hk", "seattle", "la", "useast")
	b := newCluster(t, "hoplink-b", dual, "east2")

	blocks, err := docBlocks(filepath.Join(root, multiClusterDoc))
	if err != nil {
		t.Fatal(err)
	}
	a.helmInstall(t, "-f", writeWork(t, "values-a.yaml", blocks["values-a"]))
	a.namespace(t, "edge", "hoplink.dev/privileged-relays=true")
	a.kubectl(t, "apply", "-n", "edge", "-k", "config/samples")

	t.Run("relays ready on every node", func(t *testing.T) {
		eventually(t, 3*time.Minute, "every RelayNode ready", func() error {
			// External RelayNodes (a reused cluster's, of cluster B) run no pods here.
			out, err := a.try("-n", "edge", "get", "relaynodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.external}={.status.ready}/{.status.desired} {end}`)
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			home := 0
			for _, f := range strings.Fields(out) {
				if strings.Contains(f, "=true=") {
					continue
				}
				home++
				if !strings.HasSuffix(f, "=1/1") {
					return fmt.Errorf("%s", out)
				}
			}
			if home != 4 {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
	})

	// A relay in the pod network raises its own TCP buffers' ceiling by
	// the pod's sysctls, which the kubelet must accept; its log says what
	// the kernel gives it.
	t.Run("a pod-network relay's TCP buffers", func(t *testing.T) {
		a.kubectl(t, "create", "namespace", "podnet")
		a.apply(t, "podnet", `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: podnet}
spec: {listen: {port: 7402}, hostNetwork: false, nodeSelector: {hoplink.dev/site: hk}}
`)
		eventually(t, 2*time.Minute, "the pod-network relay logs its send buffer ceiling", func() error {
			out, err := a.try("-n", "podnet", "logs", "-l", "hoplink.dev/relaynode=podnet", "--tail=-1")
			if err != nil {
				return fmt.Errorf("%v: %s", err, lastLines(out, 3))
			}
			if !strings.Contains(out, "send_buffer_max=16777216") {
				return fmt.Errorf("no send_buffer_max=16777216 in its log: %s", lastLines(out, 5))
			}
			return nil
		})
		a.kubectl(t, "delete", "namespace", "podnet", "--wait=false")
	})

	t.Run("relays publish endpoints of both families", func(t *testing.T) {
		for _, rn := range []string{"hk", "seattle", "la", "useast"} {
			out := a.kubectl(t, "-n", "edge", "get", "relaynode", rn, "-o", `jsonpath={.status.endpoints[*]}`)
			if err := hasFamilies(strings.Fields(out), a.families()); err != nil {
				t.Errorf("RelayNode %s status.endpoints %q: %v", rn, out, err)
			}
		}
	})

	hkNode := a.nodeContainer(t, "hk")
	t.Run("TCP through the Tunnel's Service", func(t *testing.T) {
		// The entry listens on every address: a ClusterIP of each family.
		for _, ip := range clusterIPs(t, a, "edge", "web") {
			eventually(t, time.Minute, "an answer from the API server through hk -> seattle -> la -> useast at "+ip, func() error {
				out, err := httpToTLS(hkNode, ip, 8080)
				if !strings.Contains(out, httpsAnswer) {
					return fmt.Errorf("%v: %q", err, out)
				}
				return nil
			})
		}
	})

	// Each relay has its next hop's endpoints of both families and dials
	// both: IPv6 answers as fast here, and is tried first.
	t.Run("links run on IPv6", func(t *testing.T) {
		for _, l := range [][2]string{{"hk", "seattle"}, {"seattle", "la"}, {"la", "useast"}} {
			relay, peer := l[0], l[1]
			// (Metrics are served on the pod's IP, status.podIP: the node's
			// address of the cluster's first family.)
			ip := a.nodeIP(t, relay, a.families()[0])
			eventually(t, time.Minute, relay+"'s link to "+peer+" on IPv6", func() error {
				m, err := onNode(hkNode, fmt.Sprintf(`exec 3<>/dev/tcp/%s/7402 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3`, ip))
				if f := peerFamily(m, relay, peer); f != ipv6 {
					return fmt.Errorf("family %q (%v):\n%s", f, err, grep(m, "hoplink_peer_family_info"))
				}
				return nil
			})
		}
	})

	// With IPv6 to its next hop dropped, a relay's new link takes IPv4.
	t.Run("a link falls back to IPv4 when IPv6 is blocked", func(t *testing.T) {
		seattle6 := a.nodeIP(t, "seattle", ipv6)
		for _, proto := range []string{"udp", "tcp"} { // QUIC, and TLS over TCP where QUIC fails
			rule := fmt.Sprintf("OUTPUT -d %s -p %s --dport 7401 -j DROP", seattle6, proto)
			if out, err := onNode(hkNode, "ip6tables -I "+rule); err != nil {
				t.Fatalf("ip6tables on hk: %v: %s", err, out)
			}
			defer onNode(hkNode, "ip6tables -D "+rule)
		}
		// hk's relay starts again and dials seattle afresh.
		a.kubectl(t, "-n", "edge", "delete", "pods", "-l", "hoplink.dev/relaynode=hk", "--wait=true", "--timeout=1m")
		hkIP := a.nodeIP(t, "hk", a.families()[0])
		eventually(t, 2*time.Minute, "hk's link to seattle on IPv4", func() error {
			m, err := onNode(hkNode, fmt.Sprintf(`exec 3<>/dev/tcp/%s/7402 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3`, hkIP))
			if f := peerFamily(m, "hk", "seattle"); f != ipv4 {
				return fmt.Errorf("family %q (%v):\n%s", f, err, grep(m, "hoplink_peer_family_info"))
			}
			return nil
		})
		ip := clusterIPs(t, a, "edge", "web")[0]
		eventually(t, time.Minute, "an answer through hk -> seattle (IPv4) -> la -> useast", func() error {
			out, err := httpToTLS(hkNode, ip, 8080)
			if !strings.Contains(out, httpsAnswer) {
				return fmt.Errorf("%v: %q", err, out)
			}
			return nil
		})
	})

	t.Run("UDP through a Tunnel's Service", func(t *testing.T) {
		a.apply(t, "edge", `apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: dns}
spec: {chain: to-east, protocol: udp, listen: {port: 5353}, target: "kube-dns.kube-system.svc.cluster.local:53"}
`)
		eventually(t, time.Minute, "the Service dns", func() error {
			_, err := a.try("-n", "edge", "get", "service", "dns")
			return err
		})
		for _, ip := range clusterIPs(t, a, "edge", "dns") {
			eventually(t, time.Minute, "a DNS answer through the chain at "+ip, func() error {
				out, err := dnsQuery(hkNode, ip, 5353)
				// The answer keeps the query's id, is a response without error,
				// and carries an answer record.
				b, _ := hex.DecodeString(out)
				if len(b) < 12 || b[0] != 0x4e || b[1] != 0x21 || b[2]&0x80 == 0 || b[3]&0x0f != 0 || int(b[6])<<8|int(b[7]) == 0 {
					return fmt.Errorf("%v: %q", err, out)
				}
				return nil
			})
		}
	})

	t.Run("a chain across two clusters", func(t *testing.T) {
		// The steps of docs/multi-cluster.md, its certificate commands and
		// manifests read from the page, so that the page is what runs.
		b.helmInstall(t, "-f", writeWork(t, "values-b.yaml", blocks["values-b"]))
		b.namespace(t, "edge", "hoplink.dev/privileged-relays=true")

		// Each cluster keeps its own CA key; both trust both CAs.
		trust := exec.Command("bash", "-euo", "pipefail", "-c", blocks["trust"])
		trust.Dir = work
		trust.Env = append(os.Environ(),
			"KUBECONFIG="+a.kubeconfig+string(os.PathListSeparator)+b.kubeconfig,
			"A=kind-"+a.name, "B=kind-"+b.name,
			"PATH="+filepath.Dir(kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))
		if out, err := trust.CombinedOutput(); err != nil {
			t.Fatalf("the certificate commands of %s: %v\n%s", multiClusterDoc, err, out)
		}

		// (The page's addresses are IPv4; the relays of each cluster
		// publish both families among themselves.)
		hkIP, east2IP := a.nodeIP(t, "hk", ipv4), b.nodeIP(t, "east2", ipv4)
		addrs := map[string]string{"HK_IP": hkIP, "EAST2_IP": east2IP}
		envsubst := func(s string) string { return os.Expand(s, func(k string) string { return addrs[k] }) }
		a.apply(t, "edge", envsubst(blocks["cluster-a"]))
		b.apply(t, "edge", envsubst(blocks["cluster-b"]))
		eventually(t, 2*time.Minute, "an answer from cluster B's API server through hk (A) -> east2 (B)", func() error {
			out, err := httpToTLS(hkNode, hkIP, 8081)
			if !strings.Contains(out, httpsAnswer) {
				return fmt.Errorf("%v: %q", err, out)
			}
			return nil
		})
		// The flow left by B's relay, whose metrics are served on its
		// pod's address (the node's, on the host network).
		metrics, err := onNode(b.nodeContainer(t, "east2"), fmt.Sprintf(`exec 3<>/dev/tcp/%s/7402 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && timeout 5 cat <&3`, east2IP))
		if !strings.Contains(metrics, `hoplink_tunnel_flows_total{relay="east2",role="exit",tunnel="edge/far"}`) {
			t.Errorf("east2 counted no exit flow of edge/far (%v):\n%s", err, grep(metrics, "hoplink_tunnel_flows_total"))
		}
	})

	t.Run("services by name across clusters", func(t *testing.T) { servicesAcrossClusters(t, a, b, blocks) })

	t.Run("sidecar relays", func(t *testing.T) { sidecars(t, a) })

	t.Run("reroute when a relay is deleted", func(t *testing.T) {
		a.apply(t, "edge", `apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: fast}
spec: {entry: hk, exit: useast, via: [seattle, la], mode: sum, maxHops: 2, probe: {interval: 1s}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: fastweb}
spec: {chain: fast, protocol: tcp, listen: {port: 8082}, target: "kubernetes.default.svc.cluster.local:443"}
`)
		// Cut hk's direct link to useast, so the route must pass a relay
		// (one: maxHops 2 keeps the route to a single middle, which a sum
		// chain of equal links would otherwise pick among ties).
		// Both families: the relays dial each.
		for _, f := range a.families() {
			ipt, useastIP := "iptables", a.nodeIP(t, "useast", f)
			if f == ipv6 {
				ipt = "ip6tables"
			}
			if out, err := onNode(hkNode, fmt.Sprintf("%s -I OUTPUT -d %s -p udp --dport 7401 -j DROP && %s -I OUTPUT -d %s -p tcp --dport 7401 -j DROP", ipt, useastIP, ipt, useastIP)); err != nil {
				t.Fatalf("%s on hk: %v: %s", ipt, err, out)
			}
		}
		var via string
		eventually(t, 2*time.Minute, "a route through seattle or la", func() error {
			r := a.chain(t, "edge", "fast").Route
			if len(r) != 3 {
				return fmt.Errorf("route %v", r)
			}
			via = r[1]
			return nil
		})
		// The relay leaves its node for good: the node loses the label its
		// DaemonSet selects, so the pod is deleted and not recreated.
		t.Logf("route hk -> %s -> useast; deleting %s's relay", via, via)
		a.kubectl(t, "label", "node", a.nodeContainer(t, via), "hoplink.dev/site-")
		eventually(t, time.Minute, "a route around "+via, func() error {
			r := a.chain(t, "edge", "fast").Route
			if len(r) != 3 || r[1] == via {
				return fmt.Errorf("route %v", r)
			}
			return nil
		})
		eventually(t, time.Minute, "traffic on the new route", func() error {
			out, err := httpToTLS(hkNode, a.nodeIP(t, "hk", ipv6), 8082)
			if !strings.Contains(out, httpsAnswer) {
				return fmt.Errorf("%v: %q", err, out)
			}
			return nil
		})
	})

	t.Run("webhook down: labelled pods fail, others start", func(t *testing.T) {
		a.kubectl(t, "-n", "hoplink-system", "scale", "deployment", "hoplink-operator", "--replicas=0")
		eventually(t, 2*time.Minute, "no operator pod", func() error {
			out, _ := a.try("-n", "hoplink-system", "get", "pods", "-l", "app.kubernetes.io/component=operator", "-o", "name")
			if strings.TrimSpace(out) != "" {
				return fmt.Errorf("still %s", out)
			}
			return nil
		})
		out, err := a.try("-n", "edge", "run", "labelled", "--image", appImage, "--labels", "hoplink.dev/relaynode=web", "--", "serve", ":8080")
		if err == nil || !strings.Contains(out, `failed calling webhook "sidecar.hoplink.dev"`) {
			t.Errorf("a labelled pod with the webhook down: %v: %s", err, out)
		}
		if out, err := a.try("-n", "edge", "run", "plain", "--image", appImage, "--", "serve", ":8080"); err != nil {
			t.Errorf("an unlabelled pod with the webhook down: %v: %s", err, out)
		}
		a.kubectl(t, "-n", "hoplink-system", "scale", "deployment", "hoplink-operator", "--replicas=2")
	})

	t.Run("cleanup on uninstall", func(t *testing.T) {
		a.kubectl(t, "delete", "namespace", "edge", "--wait=true", "--timeout=2m")
		sh(t, helmBin, "--kubeconfig", a.kubeconfig, "uninstall", "hoplink", "-n", "hoplink-system", "--wait", "--timeout", "2m")
		eventually(t, 2*time.Minute, "nothing of hoplink left but its CRDs", func() error {
			var left []string
			for _, q := range [][]string{
				{"get", "daemonsets,deployments,pods", "-A", "-l", "app.kubernetes.io/name=hoplink", "-o", "name"},
				{"get", "clusterroles,clusterrolebindings,mutatingwebhookconfigurations", "-o", "name"},
			} {
				out, err := a.try(q...)
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				for _, l := range strings.Fields(out) {
					if !strings.HasPrefix(l, "clusterrole") && !strings.HasPrefix(l, "mutatingwebhook") || strings.Contains(l, "hoplink") {
						left = append(left, l)
					}
				}
			}
			if len(left) > 0 {
				return fmt.Errorf("left: %v", left)
			}
			return nil
		})
	})
}

// clusterIPs are a Service's ClusterIPs, checked to be one of each family
// of its cluster.
func clusterIPs(t *testing.T, c *cluster, ns, name string) []string {
	t.Helper()
	ips := strings.Fields(c.kubectl(t, "-n", ns, "get", "service", name, "-o", "jsonpath={.spec.clusterIPs[*]}"))
	if err := hasFamilies(ips, c.families()); err != nil {
		t.Fatalf("Service %s/%s: clusterIPs %v: %v", ns, name, ips, err)
	}
	return ips
}

// hasFamilies says whether addrs (addresses or host:port) hold an address
// of each family of want, and of no other.
func hasFamilies(addrs, want []string) error {
	have := map[string]bool{}
	for _, a := range addrs {
		have[familyOf(a)] = true
	}
	for _, f := range want {
		if !have[f] {
			return fmt.Errorf("no %s address", f)
		}
		delete(have, f)
	}
	for f := range have {
		return fmt.Errorf("an address of family %q", f)
	}
	return nil
}

// peerFamily is the family hoplink_peer_family_info gives for relay's
// link to peer in a relay's metrics, "" when none is up.
func peerFamily(metrics, relay, peer string) string {
	for _, l := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(l, "hoplink_peer_family_info{") || !strings.HasSuffix(l, " 1") ||
			!strings.Contains(l, `relay="`+relay+`"`) || !strings.Contains(l, `peer="`+peer+`"`) {
			continue
		}
		if _, rest, ok := strings.Cut(l, `family="`); ok {
			f, _, _ := strings.Cut(rest, `"`)
			return f
		}
	}
	return ""
}

func grep(s, substr string) string {
	var b bytes.Buffer
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
