package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hoplink/hoplink/manifest"
)

// forwardSpec is what 'hoplink forward' was asked for.
type forwardSpec struct {
	listen, target string
	allowSources   []string
	entry, exit    string
	via            []string
	protocol       string
	relayPort      int
}

func newForwardCmd(lf *logFlags) *cobra.Command {
	var fs forwardSpec
	var o localRun
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "forward --listen [ADDR:]PORT --target HOST:PORT [--via NAME]...",
		Short: "Forward a port through a chain of relays on this machine, and print the manifests that stand for it",
		Long: `The simplest chain without writing YAML: an entry relay that listens at
--listen, the --via relays in order, and an exit relay that dials --target,
all in this process as 'hoplink local' runs them. First it prints the
RelayNodes, Chain and Tunnel it runs (on stdout; logs go to stderr):
'hoplink local -f FILE' runs the same from a file, and the same manifests,
with each relay's listen address and endpoints set to its host's, run the
relays on separate hosts ('hoplink relay'). Relays listen on 127.0.0.1 from
--relay-port up, one port each.

--listen PORT listens on 127.0.0.1 only: anyone who reaches the port uses
the chain, so other hosts are let in by name, with an address
(--listen 0.0.0.0:PORT or [::]:PORT for every one), and --allow-source
narrows who may connect.`,
		Example: `  # 127.0.0.1:8080 -> entry -> exit -> example.net:80
  hoplink forward --listen 127.0.0.1:8080 --target example.net:80

  # through two relays between, UDP; print the manifests only
  hoplink forward --listen 5353 --target 10.0.0.53:53 --protocol udp --via a --via b --dry-run

  # every address of this host, for clients of one network only
  hoplink forward --listen 0.0.0.0:8080 --allow-source 192.168.1.0/24 --target 10.0.0.80:80`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc, err := fs.manifests()
			if err != nil {
				return err
			}
			set, err := manifest.Parse("hoplink forward", []byte(doc))
			if err != nil {
				return fmt.Errorf("the manifests of these flags: %w", err)
			}
			fmt.Fprint(cmd.OutOrStdout(), doc)
			if dryRun {
				return nil
			}
			log, err := lf.logger()
			if err != nil {
				return err
			}
			return fs.relayPortError(o.run(log, lf.outputGone(), set, nil, doc))
		},
	}
	f := cmd.Flags()
	f.StringVar(&fs.listen, "listen", "", "where the entry relay listens: `[ADDR:]PORT` (no address: 127.0.0.1; 0.0.0.0 or [::] for every address)")
	f.StringSliceVar(&fs.allowSources, "allow-source", nil, "take clients from this network only, a `CIDR` (repeatable; none: every source); spec.listen.allowedSources")
	f.StringVar(&fs.target, "target", "", "what the exit relay dials: `HOST:PORT`")
	f.StringSliceVar(&fs.via, "via", nil, "a relay between entry and exit, by `NAME` (repeatable, in order)")
	f.StringVar(&fs.entry, "entry", "entry", "the entry relay's `NAME`")
	f.StringVar(&fs.exit, "exit", "exit", "the exit relay's `NAME`")
	f.StringVar(&fs.protocol, "protocol", "tcp", "the Tunnel's `PROTOCOL`: tcp or udp")
	f.IntVar(&fs.relayPort, "relay-port", 7401, "the entry relay's `PORT` (QUIC and TLS); each next relay takes the next one")
	f.BoolVar(&dryRun, "dry-run", false, "print the manifests and exit")
	o.flags(f)
	must(cmd.MarkFlagRequired("listen"))
	must(cmd.MarkFlagRequired("target"))
	return cmd
}

// manifests writes the RelayNodes, Chain and Tunnel of fs as YAML, after
// checking each flag, so a mistake names the flag rather than a field of
// manifests the user never wrote.
func (fs *forwardSpec) manifests() (string, error) {
	addr, port, err := splitListen(fs.listen)
	if err != nil {
		return "", err
	}
	if host, p, err := net.SplitHostPort(fs.target); err != nil || host == "" {
		return "", fmt.Errorf("--target %q: want HOST:PORT, e.g. example.net:80 or [::1]:53", fs.target)
	} else if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("--target %q: port %q is out of range; use 1-65535", fs.target, p)
	}
	if fs.protocol != "tcp" && fs.protocol != "udp" {
		return "", fmt.Errorf("--protocol %q: use tcp or udp", fs.protocol)
	}
	route := append(append([]string{fs.entry}, fs.via...), fs.exit)
	for i, n := range route {
		flag := "--via"
		switch i {
		case 0:
			flag = "--entry"
		case len(route) - 1:
			flag = "--exit"
		}
		if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
			return "", fmt.Errorf("%s %q: %s (relay names become certificate names)", flag, n, strings.Join(msgs, "; "))
		}
		if slices.Index(route, n) != i {
			return "", fmt.Errorf("%s %q: the chain has a relay of that name already (%s); each relay needs a name of its own", flag, n, strings.Join(route[:i], ", "))
		}
	}
	if fs.relayPort < 1 || fs.relayPort+len(route)-1 > 65535 {
		return "", fmt.Errorf("--relay-port %d: the %d relays take ports %d-%d; use 1-%d", fs.relayPort, len(route), fs.relayPort, fs.relayPort+len(route)-1, 65536-len(route))
	}
	var sources []string
	for _, c := range fs.allowSources {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return "", fmt.Errorf("--allow-source %q: want a CIDR, e.g. 192.168.1.0/24 or 2001:db8::/32", c)
		}
		sources = append(sources, fmt.Sprintf("%q", p.Masked()))
	}
	if lp := fs.relayPort; port >= lp && port < lp+len(route) && (addr == "" || addr == "127.0.0.1" || addr == "0.0.0.0" || addr == "::") {
		return "", fmt.Errorf("--listen %q: port %d is a relay's (--relay-port %d takes %d-%d); pick another port, or another --relay-port", fs.listen, port, lp, lp, lp+len(route)-1)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "# hoplink forward: %s -> %s -> %s\n", fs.listen, strings.Join(route, " -> "), fs.target)
	for i, n := range route {
		p := fs.relayPort + i
		fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec:\n  listen: {address: 127.0.0.1, port: %d}\n  endpoints: [\"127.0.0.1:%d\"]\n", n, p, p)
	}
	fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: forward}\nspec:\n  entry: %s\n  exit: %s\n", fs.entry, fs.exit)
	if len(fs.via) > 0 {
		fmt.Fprintf(&b, "  via: [%s]\n", strings.Join(fs.via, ", "))
	}
	fmt.Fprintf(&b, "  mode: static\n  route: [%s]\n", strings.Join(route, ", "))
	// An unspecified address is written out as the empty one: every
	// address, which is what the field's documentation calls it.
	listen := fmt.Sprintf("{port: %d", port)
	if a, err := netip.ParseAddr(addr); err == nil && !a.IsUnspecified() {
		listen = fmt.Sprintf("{address: %q, port: %d", addr, port)
	}
	if len(sources) > 0 {
		listen += fmt.Sprintf(", allowedSources: [%s]", strings.Join(sources, ", "))
	}
	listen += "}"
	fmt.Fprintf(&b, "---\napiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: forward}\nspec:\n  chain: forward\n  protocol: %s\n  listen: %s\n  target: %q\n",
		fs.protocol, listen, fs.target)
	return b.String(), nil
}

// relayPortError names --relay-port in the error of a relay whose port is
// taken: the user gave that flag, not the RelayNode's spec.listen the
// error of local mode names.
func (fs *forwardSpec) relayPortError(err error) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	route := append(append([]string{fs.entry}, fs.via...), fs.exit)
	for i, n := range route {
		if !strings.Contains(err.Error(), fmt.Sprintf("RelayNode %q: spec.listen", n)) {
			continue
		}
		cause := err
		var op *net.OpError
		if errors.As(err, &op) {
			cause = op
		}
		last := fs.relayPort + len(route) - 1
		return fmt.Errorf("--relay-port %d: relay %q takes port %d of %d-%d, and another process holds it (%v; 'ss -tulpn' shows which): stop it, or give a --relay-port from which %d ports are free",
			fs.relayPort, n, fs.relayPort+i, fs.relayPort, last, cause, len(route))
	}
	return err
}

// splitListen reads --listen: PORT (on loopback), ADDR:PORT, [IPv6]:PORT
// or :PORT (every address, as Go's listeners read it).
func splitListen(s string) (string, int, error) {
	host, p := "127.0.0.1", s
	if strings.Contains(s, ":") {
		var err error
		if host, p, err = net.SplitHostPort(s); err != nil {
			return "", 0, fmt.Errorf("--listen %q: want [ADDR:]PORT, e.g. 8080 or 127.0.0.1:8080", s)
		}
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("--listen %q: port %q is out of range; use 1-65535", s, p)
	}
	if host != "" {
		a, err := netip.ParseAddr(host)
		if err != nil {
			return "", 0, fmt.Errorf("--listen %q: %q is not an IP address; give one of this host's, 0.0.0.0 for every address, or only the port for 127.0.0.1", s, host)
		}
		host = a.String()
	}
	return host, port, nil
}
