package main

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/pki"
)

// standaloneDoc is the "Standalone relays" part of docs/troubleshooting.md:
// each section's heading and the lines its text blocks quote.
func standaloneDoc(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Standalone relays\n")
	if start < 0 {
		t.Fatal("docs/troubleshooting.md has no section Standalone relays")
	}
	part := doc[start+1:]
	if end := strings.Index(part[3:], "\n## "); end >= 0 {
		part = part[:end+3]
	}
	out := map[string][]string{}
	heading, inBlock := "", false
	for _, l := range strings.Split(part, "\n") {
		switch {
		case strings.HasPrefix(l, "### "):
			heading = strings.TrimPrefix(l, "### ")
			out[heading] = nil
		case l == "```text":
			inBlock = true
		case l == "```":
			inBlock = false
		case inBlock && heading != "" && strings.TrimSpace(l) != "":
			out[heading] = append(out[heading], l)
		}
	}
	return out
}

var (
	logTime = regexp.MustCompile(`^time=\S+ `)
	digits  = regexp.MustCompile(`[0-9]+`)
)

// normal is a line with what varies from run to run made alike: a log
// line's time, and every number (ports, addresses, dates, uids).
func normal(l string) string {
	return digits.ReplaceAllString(logTime.ReplaceAllString(strings.TrimSpace(l), ""), "#")
}

// quotes says whether some line of out is the quoted line q, where "..."
// in q stands for anything.
func quotes(out, q string) bool {
	parts := strings.Split(normal(q), "...")
	for _, l := range strings.Split(out, "\n") {
		l = normal(l)
		if !strings.HasPrefix(l, parts[0]) {
			continue
		}
		rest, ok := l[len(parts[0]):], true
		for _, p := range parts[1:] {
			i := strings.Index(rest, p)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(p):]
		}
		if ok && (parts[len(parts)-1] == "" || rest == "") {
			return true
		}
	}
	return false
}

// host is a relay's /etc/hoplink, under a directory of the test's.
type host struct {
	t    *testing.T
	root string
	bin  string
	// uid runs the process as another user (0: this one's).
	uid int
}

// start runs hoplink with args on h; stop (also at cleanup) ends it and
// returns its output, with h's root written as /etc/hoplink.
func (h *host) start(args ...string) (out *testutil.Buffer, stop func() string) {
	h.t.Helper()
	cmd := exec.Command(h.bin, args...)
	out = &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if h.uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(h.uid), Gid: uint32(h.uid)}}
	}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	var once sync.Once
	stop = func() string {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		})
		return strings.ReplaceAll(out.String(), h.root, "/etc/hoplink")
	}
	h.t.Cleanup(func() { stop() })
	return out, stop
}

// run runs hoplink with args on h until it exits, or until the output has
// want (when not empty) or 20 s pass.
func (h *host) run(want string, args ...string) string {
	h.t.Helper()
	out, stop := h.start(args...)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		s := out.String()
		if want != "" && strings.Contains(s, want) || strings.HasPrefix(s, "hoplink: ") || strings.Contains(s, "\nhoplink: ") {
			break
		}
	}
	return stop()
}

// TestTroubleshootingStandalone brings about each failure that the
// "Standalone relays" part of docs/troubleshooting.md describes, with
// relay processes on this host, and checks that what they print is what
// the page quotes.
func TestTroubleshootingStandalone(t *testing.T) {
	doc := standaloneDoc(t)
	bin := procs.Hoplink(t)
	caDir := filepath.Join(t.TempDir(), "ca")
	for _, args := range [][]string{{"cert", "ca", "--certs", caDir}, {"cert", "issue", "--certs", caDir, "hk", "la"}, {"cert", "observer", "--certs", caDir}} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	ca, err := pki.LoadCA(filepath.Join(caDir, "ca.crt"), filepath.Join(caDir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	hkPort, laPort, webPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	manifests := func(hkPort int) string {
		return fmt.Sprintf(`apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: to-la}
spec: {entry: hk, exit: la, route: [hk, la]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: web}
spec: {chain: to-la, listen: {address: 127.0.0.1, port: %d}, target: "127.0.0.1:9"}
`, hkPort, hkPort, laPort, laPort, webPort)
	}
	files := map[string][]byte{}
	for _, n := range []string{"ca.crt", "hk.crt", "hk.key", "la.crt", "la.key"} {
		b, err := os.ReadFile(filepath.Join(caDir, n))
		if err != nil {
			t.Fatal(err)
		}
		files[n] = b
	}
	read := func(n string) []byte { return files[n] }
	// newHost lays out a host's files; files are NAME: contents under
	// certs/, the manifests come with every host. Its directories may be
	// entered by anyone, so a process of another user reads what the
	// files' modes allow.
	newHost := func(t *testing.T, hkPort int, files map[string][]byte) *host {
		root, err := os.MkdirTemp("", "hoplink-etc-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(root) })
		for _, d := range []string{root, filepath.Join(root, "manifests"), filepath.Join(root, "certs")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			os.Chmod(d, 0o755)
		}
		if err := os.WriteFile(filepath.Join(root, "manifests", "m.yaml"), []byte(manifests(hkPort)), 0o644); err != nil {
			t.Fatal(err)
		}
		for n, b := range files {
			mode := os.FileMode(0o644)
			if strings.HasSuffix(n, ".key") {
				mode = 0o600
			}
			if err := os.WriteFile(filepath.Join(root, "certs", n), b, mode); err != nil {
				t.Fatal(err)
			}
		}
		return &host{t: t, root: root, bin: bin}
	}
	relayFiles := func(name string) map[string][]byte {
		return map[string][]byte{"ca.crt": read("ca.crt"), name + ".crt": read(name + ".crt"), name + ".key": read(name + ".key")}
	}
	relayArgs := func(h *host, name string, more ...string) []string {
		return append([]string{"relay", "-f", filepath.Join(h.root, "manifests"), "--name", name, "--certs", filepath.Join(h.root, "certs")}, more...)
	}
	hold := func(t *testing.T, network string, port int) {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if network == "udp" {
			c, err := net.ListenPacket("udp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	// unprivileged is a user that holds no file of the test's.
	unprivileged := func(t *testing.T, h *host) {
		if os.Getuid() != 0 {
			return
		}
		// The test's own directories are closed to other users: the
		// binary goes where it may run it.
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		h.bin = filepath.Join(h.root, "hoplink")
		if err := os.WriteFile(h.bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
		h.uid = 65534
	}
	// relayCert issues hk's certificate (on its key) valid from notBefore
	// for lifetime.
	hkKey := read("hk.key")
	pair, err := tls.X509KeyPair(read("hk.crt"), hkKey)
	if err != nil {
		t.Fatal(err)
	}
	relayCert := func(t *testing.T, notBefore time.Time, lifetime time.Duration) []byte {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "hk"}, DNSNames: []string{"hk"},
			NotBefore: notBefore, NotAfter: notBefore.Add(lifetime), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pair.Leaf.PublicKey, ca.Key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}

	cases := map[string]func(t *testing.T) string{
		"A relay's port is taken": func(t *testing.T) string {
			hold(t, "udp", hkPort)
			h := newHost(t, hkPort, relayFiles("hk"))
			return h.run("", relayArgs(h, "hk")...)
		},
		"A Tunnel's port is taken": func(t *testing.T) string {
			hold(t, "tcp", webPort)
			h := newHost(t, hkPort, relayFiles("hk"))
			return h.run("cannot open the Tunnel's entry", relayArgs(h, "hk")...)
		},
		"The metrics port is taken": func(t *testing.T) string {
			m := testutil.FreePort(t)
			hold(t, "tcp", m)
			h := newHost(t, hkPort, relayFiles("hk"))
			return h.run("", relayArgs(h, "hk", "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", m))...)
		},
		"A port below 1024": func(t *testing.T) string {
			if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start"); err == nil {
				if n, _ := strconv.Atoi(strings.TrimSpace(string(b))); n <= 1023 {
					// skip-ok: the host's setting (containers often lower it), no missing tool.
					t.Skipf("this host lets anyone bind port 1023 (ip_unprivileged_port_start %d)", n)
				}
			}
			files := relayFiles("hk")
			h := newHost(t, 1023, files)
			unprivileged(t, h)
			os.Chmod(filepath.Join(h.root, "certs", "hk.key"), 0o644) // only the port is in the way
			return h.run("", relayArgs(h, "hk")...)
		},
		"A Tunnel's target refuses connections": func(t *testing.T) string {
			// The Tunnel's target, 127.0.0.1:9, has no listener.
			hk, la := newHost(t, hkPort, relayFiles("hk")), newHost(t, hkPort, relayFiles("la"))
			_, stopHK := hk.start(relayArgs(hk, "hk")...)
			laOut, stopLA := la.start(relayArgs(la, "la")...)
			defer stopHK()
			for deadline := time.Now().Add(20 * time.Second); !strings.Contains(laOut.String(), "cannot connect to target") && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", webPort)); err == nil {
					c.Write([]byte("hello"))
					c.SetReadDeadline(time.Now().Add(2 * time.Second))
					c.Read(make([]byte, 1))
					c.Close()
				}
			}
			status, err := exec.Command(bin, "status", "-f", filepath.Join(hk.root, "manifests"), "--certs", caDir, "--timeout", "2s").CombinedOutput()
			if err == nil {
				t.Errorf("status exited 0 with the target down:\n%s", status)
			}
			return stopLA() + "\n" + string(status)
		},
		"Peers cannot reach a relay": func(t *testing.T) string {
			// la's UDP port takes packets and answers none, as behind a
			// firewall that drops them; its TCP port is closed.
			hold(t, "udp", laPort)
			h := newHost(t, hkPort, relayFiles("hk"))
			out, stop := h.start(relayArgs(h, "hk")...)
			for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), "no answer to the QUIC handshake") && time.Now().Before(deadline); {
				time.Sleep(100 * time.Millisecond)
			}
			status, _ := exec.Command(bin, "status", "-f", filepath.Join(h.root, "manifests"), "--certs", caDir, "--timeout", "2s").CombinedOutput()
			return stop() + "\n" + string(status)
		},
		"Certificate files are missing": func(t *testing.T) string {
			h := newHost(t, hkPort, map[string][]byte{"ca.crt": read("ca.crt")})
			return h.run("", relayArgs(h, "hk")...)
		},
		"The relay may not read its key": func(t *testing.T) string {
			h := newHost(t, hkPort, relayFiles("hk"))
			unprivileged(t, h)
			if h.uid == 0 {
				os.Chmod(filepath.Join(h.root, "certs", "hk.key"), 0)
			}
			return h.run("", relayArgs(h, "hk")...)
		},
		"A certificate of another CA or of another relay": func(t *testing.T) string {
			other, _ := pki.NewCA("other")
			oc, ok, _ := other.Issue("hk")
			h := newHost(t, hkPort, map[string][]byte{"ca.crt": read("ca.crt"), "hk.crt": oc, "hk.key": ok, "la.crt": read("la.crt"), "la.key": read("la.key")})
			out := h.run("", relayArgs(h, "hk")...)
			certs := filepath.Join(h.root, "certs")
			out += h.run("", "relay", "-f", filepath.Join(h.root, "manifests"), "--name", "hk", "--ca", filepath.Join(certs, "ca.crt"),
				"--cert", filepath.Join(certs, "la.crt"), "--key", filepath.Join(certs, "la.key"))
			// la runs with the other CA's files; hk, with the CA's, dials it.
			lc, lk, _ := other.Issue("la")
			la := newHost(t, hkPort, map[string][]byte{"ca.crt": other.PEM, "la.crt": lc, "la.key": lk})
			_, stopLa := la.start(relayArgs(la, "la")...)
			defer stopLa()
			hk := newHost(t, hkPort, relayFiles("hk"))
			// The TLS transport says it first; the line quoted is QUIC's.
			return out + hk.run("CRYPTO_ERROR 0x12a (local)", relayArgs(hk, "hk")...)
		},
		"An expired certificate": func(t *testing.T) string {
			h := newHost(t, hkPort, map[string][]byte{"ca.crt": read("ca.crt"), "hk.crt": relayCert(t, time.Now().Add(-time.Hour), 59*time.Minute), "hk.key": hkKey})
			out := h.run("", relayArgs(h, "hk")...)
			// hk's certificate expires 8 s after it is issued (room for a
			// slow start): la closes the connection, then refuses hk's
			// handshakes.
			la := newHost(t, hkPort, relayFiles("la"))
			laOut, stopLa := la.start(relayArgs(la, "la")...)
			hk := newHost(t, hkPort, map[string][]byte{"ca.crt": read("ca.crt"), "hk.crt": relayCert(t, time.Now().Add(-time.Minute), time.Minute+8*time.Second), "hk.key": hkKey})
			_, stopHk := hk.start(relayArgs(hk, "hk")...)
			seen := func() bool {
				s := laOut.String()
				return strings.Contains(s, "rejected peer certificate") && strings.Contains(s, `transport=quic err="its certificate expired`)
			}
			for deadline := time.Now().Add(30 * time.Second); !seen() && time.Now().Before(deadline); {
				time.Sleep(100 * time.Millisecond)
			}
			stopHk()
			return out + stopLa()
		},
		"Clocks that disagree": func(t *testing.T) string {
			// Issued by a CA whose clock is a day ahead of this host's.
			h := newHost(t, hkPort, map[string][]byte{"ca.crt": read("ca.crt"), "hk.crt": relayCert(t, time.Now().Add(24*time.Hour-time.Minute), pki.RelayValidity), "hk.key": hkKey})
			return h.run("", relayArgs(h, "hk")...)
		},
	}
	for heading := range doc {
		if cases[heading] == nil {
			t.Errorf("docs/troubleshooting.md: section %q has no case here that brings it about", heading)
		}
	}
	for heading, produce := range cases {
		t.Run(strings.ReplaceAll(heading, " ", "_"), func(t *testing.T) {
			quoted, ok := doc[heading]
			if !ok {
				t.Fatalf("docs/troubleshooting.md has no section %q", heading)
			}
			if len(quoted) == 0 {
				t.Fatalf("section %q quotes nothing", heading)
			}
			out := produce(t)
			for _, q := range quoted {
				if !quotes(out, q) {
					t.Errorf("hoplink printed no line the page quotes:\n  %s\nit printed:\n%s", q, out)
				}
			}
		})
	}
}
