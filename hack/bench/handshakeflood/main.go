// Command handshakeflood measures what silent TCP connections to a relay's
// TLS port, before any handshake, cost its peers and its admin API. It
// runs two relays in one `hoplink local` process, hk -> la over a Chain
// with `transport: tls`, and a Tunnel to an echo server. Then -sources
// loopback addresses (127.0.0.11 on) hold -per-source silent connections
// each to la's TLS port, each re-opened when la closes it or after 5 s.
// For -duration it sends a short flow through the Tunnel every 500 ms and
// runs `hoplink status` every 2 s, and prints how many of each failed and
// when the first did.
//
//	go run ./hack/bench/handshakeflood -hoplink bin/hoplink
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/testing/freeport"
)

func main() {
	bin := flag.String("hoplink", "bin/hoplink", "the hoplink binary")
	sources := flag.Int("sources", 2, "loopback addresses the flood comes from")
	perSource := flag.Int("per-source", 64, "silent connections each source holds")
	duration := flag.Duration("duration", 45*time.Second, "how long flows and status are tried under the flood")
	flag.Parse()
	if err := run(*bin, *sources, *perSource, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "handshakeflood:", err)
		os.Exit(1)
	}
}

const manifests = `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {listen: {address: 127.0.0.1, port: %[1]d}, endpoints: ["127.0.0.1:%[1]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {address: 127.0.0.1, port: %[2]d}, endpoints: ["127.0.0.1:%[2]d"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la], transport: tls}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: echo}
spec: {chain: c, protocol: tcp, listen: {address: 127.0.0.1, port: %[3]d}, target: "%[4]s"}
`

var certsFlag = regexp.MustCompile(`--certs (\S+?)"`)

func run(bin string, sources, perSource int, duration time.Duration) error {
	echo, err := echoServer()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "handshakeflood")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	hk, la, tunnel := freePort(), freePort(), freePort()
	if err := os.WriteFile(filepath.Join(dir, "net.yaml"), fmt.Appendf(nil, manifests, hk, la, tunnel, echo), 0o644); err != nil {
		return err
	}
	cmd := exec.Command(bin, "local", "-f", dir, "--log-level", "info")
	logs, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	certs := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			if m := certsFlag.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case certs <- m[1]:
				default:
				}
			}
		}
	}()
	var certDir string
	select {
	case certDir = <-certs:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("no certificate directory in the relays' log within 30 s")
	}
	tunnelAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tunnel))
	deadline := time.Now().Add(30 * time.Second)
	for flow(tunnelAddr) != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("no flow through the Tunnel within 30 s of the start")
		}
		time.Sleep(200 * time.Millisecond)
	}
	status := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, bin, "status", "-f", dir, "--certs", certDir).CombinedOutput()
		for _, l := range bytes.Split(out, []byte("\n")) {
			if f := strings.Fields(string(l)); len(f) > 1 && f[0] == "la" {
				if f[1] == "yes" {
					return nil
				}
				return fmt.Errorf("la: %s", f[1])
			}
		}
		return fmt.Errorf("no line for la in %q", out)
	}
	if err := status(); err != nil {
		return fmt.Errorf("status before the flood: %w", err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(la))
	for s := range sources {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(11+s))}, Timeout: time.Second}
		for range perSource {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hold(d, target, stop)
			}()
		}
	}
	start := time.Now()
	type tally struct {
		tried, failed int
		first         time.Duration
		last          error
	}
	var flows, stats tally
	count := func(t *tally, err error) {
		t.tried++
		if err != nil {
			if t.failed == 0 {
				t.first = time.Since(start)
			}
			t.failed++
			t.last = err
		}
	}
	flowTick, statusTick := time.NewTicker(500*time.Millisecond), time.NewTicker(2*time.Second)
	for end := time.After(duration); ; {
		select {
		case <-flowTick.C:
			count(&flows, flow(tunnelAddr))
			continue
		case <-statusTick.C:
			count(&stats, status())
			continue
		case <-end:
		}
		break
	}
	close(stop)
	wg.Wait()
	say := func(what string, t tally) {
		fmt.Printf("%s: %d of %d failed", what, t.failed, t.tried)
		if t.failed > 0 {
			fmt.Printf(", the first %.0f s in (last: %v)", t.first.Seconds(), t.last)
		}
		fmt.Println()
	}
	fmt.Printf("flood: %d source(s) x %d silent connections to la's TLS port, for %s\n", sources, perSource, duration)
	say("flows over transport tls (every 500 ms)", flows)
	say("hoplink status reaching la (every 2 s)", stats)
	return nil
}

// hold keeps a silent connection to addr open, re-opened when the relay
// closes it and every 5 s, until stop.
func hold(d net.Dialer, addr string, stop <-chan struct{}) {
	for {
		c, err := d.Dial("tcp", addr)
		if err == nil {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			done := make(chan struct{})
			go func() { io.Copy(io.Discard, c); close(done) }()
			select {
			case <-done:
			case <-stop:
			}
			c.Close()
		}
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// flow sends 16 bytes through the Tunnel and reads their echo.
func flow(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	msg := []byte("sixteen bytes...")
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("no echo: %w", err)
	}
	return nil
}

func echoServer() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String(), nil
}

// freePort picks below the ephemeral range, where no outgoing connection
// takes the port before a relay listens on it.
func freePort() int {
	p, err := freeport.Pick()
	if err != nil {
		panic(err)
	}
	return p
}
