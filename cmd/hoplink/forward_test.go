package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
)

// freeRun finds n consecutive loopback ports free for TCP and UDP: the
// relays of 'forward' take one each from --relay-port up.
func freeRun(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		base := testutil.FreePort(t)
		ok := true
		for p := base + 1; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				break
			}
			u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
			l.Close()
			if err != nil {
				ok = false
				break
			}
			u.Close()
		}
		if ok && base+n <= 65535 {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// 'hoplink forward' carries a TCP flow from --listen through entry, m
// and exit to --target, and first prints manifests that load as they are
// and describe that chain. SIGTERM ends it.
func TestForwardCarriesAFlow(t *testing.T) {
	bin := procs.Hoplink(t)
	target := testutil.EchoServer(t)
	listen := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	cmd := exec.Command(bin, "forward", "--listen", listen, "--target", target, "--via", "m",
		"--relay-port", fmt.Sprint(freeRun(t, 3)), "--drain-timeout", "1s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// The buffers are read once the process has exited (Wait has
	// copied everything into them).
	exited := false
	stop := func() {
		if !exited {
			cmd.Process.Kill()
			<-done
			exited = true
		}
	}
	t.Cleanup(stop)

	payload := bytes.Repeat([]byte("hoplink forward "), 4096)
	var got []byte
	for deadline := time.Now().Add(30 * time.Second); ; {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			go func() { c.Write(payload); c.(*net.TCPConn).CloseWrite() }()
			got, err = io.ReadAll(c)
			c.Close()
			if err == nil && len(got) > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("no flow through %s: %v\nstderr:\n%s", listen, err, stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("the flow brought back %d bytes, want the %d sent", len(got), len(payload))
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		exited = true
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		stop()
		t.Fatalf("still running 30 s after SIGTERM:\n%s", stderr.String())
	}

	set, err := manifest.Parse("forward.yaml", stdout.Bytes())
	if err != nil {
		t.Fatalf("the printed manifests do not load: %v\n%s", err, stdout.String())
	}
	if strings.Join(set.RelayNames(), ",") != "entry,m,exit" || len(set.Chains) != 1 || strings.Join(set.Chains[0].Spec.Route, ",") != "entry,m,exit" ||
		len(set.Tunnels) != 1 || set.Tunnels[0].Spec.Target != target || fmt.Sprintf("127.0.0.1:%d", set.Tunnels[0].Spec.Listen.Port) != listen {
		t.Errorf("printed manifests:\n%s", stdout.String())
	}
	if strings.Contains(stdout.String(), "level=") {
		t.Errorf("logs on stdout, among the manifests:\n%s", stdout.String())
	}
}

// Each flag's mistake names the flag, before anything runs.
func TestForwardFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--target", "x:1"}, `required flag(s) "listen" not set`},
		{[]string{"--listen", "8080", "--target", "x"}, `--target "x": want HOST:PORT`},
		{[]string{"--listen", "localhost:8080", "--target", "x:1"}, `--listen "localhost:8080": "localhost" is not an IP address`},
		{[]string{"--listen", "80800", "--target", "x:1"}, `--listen "80800": port "80800" is out of range`},
		{[]string{"--listen", "7402", "--target", "x:1"}, `--listen "7402": port 7402 is a relay's (--relay-port 7401 takes 7401-7402)`},
		{[]string{"--listen", "8080", "--target", "x:1", "--via", "exit"}, `--exit "exit": the chain has a relay of that name already (entry, exit)`},
		{[]string{"--listen", "8080", "--target", "x:1", "--via", "Hong_Kong"}, `--via "Hong_Kong": a lowercase RFC 1123 label`},
		{[]string{"--listen", "8080", "--target", "x:1", "--protocol", "sctp"}, `--protocol "sctp": use tcp or udp`},
		{[]string{"--listen", "8080", "--target", "x:1", "--allow-source", "10.0.0.300/8"}, `--allow-source "10.0.0.300/8": want a CIDR`},
		{[]string{"--listen", "0.0.0.0:7401", "--target", "x:1"}, `port 7401 is a relay's`},
		{[]string{"--listen", "8080", "--target", "x:1", "--relay-port", "65535"}, `--relay-port 65535: the 2 relays take ports 65535-65536`},
	} {
		_, err := execute(append([]string{"forward", "--dry-run"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	out, err := execute("forward", "--dry-run", "--listen", "[::1]:5353", "--target", "[::1]:53", "--protocol", "udp", "--via", "a", "--via", "b")
	if err != nil {
		t.Fatal(err)
	}
	set, err := manifest.Parse("dry.yaml", []byte(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	tn := set.Tunnels[0]
	if tn.Spec.Protocol != "udp" || tn.Spec.Listen.Address != "::1" || tn.Spec.Target != "[::1]:53" || strings.Join(set.Chains[0].Spec.Route, ",") != "entry,a,b,exit" {
		t.Errorf("--dry-run printed:\n%s", out)
	}
}

// --listen PORT opens the port on loopback alone: every address takes one
// written out (0.0.0.0, [::] or :PORT), and --allow-source narrows who may
// connect (spec.listen.allowedSources).
func TestForwardListensOnLoopbackUnlessTold(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		address string
		sources string
	}{
		{[]string{"--listen", "8080"}, "127.0.0.1", ""},
		{[]string{"--listen", "192.0.2.7:8080"}, "192.0.2.7", ""},
		{[]string{"--listen", "0.0.0.0:8080"}, "", ""},
		{[]string{"--listen", "[::]:8080"}, "", ""},
		{[]string{"--listen", ":8080"}, "", ""},
		{[]string{"--listen", "0.0.0.0:8080", "--allow-source", "192.168.1.9/24", "--allow-source", "2001:db8::/32"}, "", "192.168.1.0/24,2001:db8::/32"},
	} {
		out, err := execute(append([]string{"forward", "--dry-run", "--target", "x:1"}, tc.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		set, err := manifest.Parse("forward.yaml", []byte(out))
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, out)
		}
		l := set.Tunnels[0].Spec.Listen
		if l.Address != tc.address || strings.Join(l.AllowedSources, ",") != tc.sources || l.Port != 8080 {
			t.Errorf("%v: listen %+v; want address %q, allowed sources %q", tc.args, *l, tc.address, tc.sources)
		}
	}
}

// A relay port that another process holds is told as the flag the user
// gave, --relay-port, with the way out; not as the spec.listen of a
// RelayNode the user never wrote.
func TestForwardNamesRelayPortWhenTaken(t *testing.T) {
	port := freeRun(t, 2) + 1
	tcp, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	if udp, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
		defer udp.Close()
	}
	// The exit takes the port after the entry's: the port held is the exit's.
	_, err = execute("forward", "--listen", freePort(t), "--target", "127.0.0.1:9", "--relay-port", fmt.Sprint(port-1), "--metrics-addr", "0")
	if err == nil {
		t.Fatal("forward ran with its exit relay's port taken")
	}
	for _, want := range []string{fmt.Sprintf("--relay-port %d", port-1), fmt.Sprintf(`relay "exit" takes port %d`, port), "give a --relay-port from which 2 ports are free"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "spec.listen") {
		t.Errorf("error %q names a manifest field the user never wrote", err)
	}
}
