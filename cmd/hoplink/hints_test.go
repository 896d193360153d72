package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A relay process whose own RelayNode lacks spec.endpoints runs on the
// host peers must dial: the error lists that host's addresses with the
// relay's port, never loopback or link-local ones, which other hosts
// cannot reach.
func TestMissingEndpointNamesTheHostsAddresses(t *testing.T) {
	dir := t.TempDir()
	m := `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: hk}
spec: {endpoints: ["hk.example.net:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {port: 7409}}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: c}
spec: {entry: hk, exit: la, route: [hk, la]}
`
	if err := os.WriteFile(filepath.Join(dir, "m.yaml"), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	loadErr := func() error {
		_, err := loadManifests([]string{filepath.Join(dir, "m.yaml")}, slog.New(slog.DiscardHandler))
		return err
	}()
	if loadErr == nil {
		t.Fatal("manifests without la's endpoints loaded")
	}
	addrs := func() ([]net.Addr, error) {
		return []net.Addr{
			&net.IPNet{IP: net.ParseIP("127.0.0.1"), Mask: net.CIDRMask(8, 32)},
			&net.IPNet{IP: net.ParseIP("2001:db8::5"), Mask: net.CIDRMask(64, 128)},
			&net.IPNet{IP: net.ParseIP("fe80::1"), Mask: net.CIDRMask(64, 128)},
			&net.IPNet{IP: net.ParseIP("203.0.113.9").To4(), Mask: net.CIDRMask(24, 32)},
		}, nil
	}
	err := withHostAddresses(loadErr, "la", addrs)
	want := `relay "la" runs on this host, whose addresses are: endpoints: ["203.0.113.9:7409", "[2001:db8::5]:7409"]`
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `RelayNode "la": spec.endpoints: required`) {
		t.Errorf("la's own process: %v\nwant it to say %s", err, want)
	}
	// hk's process runs elsewhere: this host's addresses are not la's.
	if err := withHostAddresses(loadErr, "hk", addrs); strings.Contains(err.Error(), "runs on this host") {
		t.Errorf("hk's process: %v", err)
	}
}

// A listener that cannot bind says why and what to do: a port another
// process holds, or one below 1024 without the privilege.
func TestPortHint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = net.Listen("tcp", ln.Addr().String())
	if got := portHint(fmt.Errorf("--metrics-addr: %w", err)); !strings.HasSuffix(got.Error(), "bind: address already in use: another process holds the port ('ss -tulpn' shows which): stop it, or choose another port") {
		t.Errorf("in use: %v", got)
	}
	denied := &net.OpError{Op: "listen", Net: "udp", Err: os.NewSyscallError("bind", syscall.EACCES)}
	if got := portHint(denied); !strings.Contains(got.Error(), "bind: permission denied: ports below 1024 need root or CAP_NET_BIND_SERVICE") {
		t.Errorf("denied: %v", got)
	}
	if other := errors.New("x"); portHint(other) != other || portHint(nil) != nil {
		t.Error("portHint changed an error that is no bind's")
	}
}
