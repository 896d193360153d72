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

	"github.com/hoplink/hoplink/manifest"
)

// withHostAddresses adds this host's addresses to an error that the relay
// this process runs has no spec.endpoints: the process runs on that
// relay's host, so its addresses are what peers may dial, which the
// manifests alone cannot say.
func withHostAddresses(err error, name string, addrs func() ([]net.Addr, error)) error {
	var me *manifest.MissingEndpointError
	if !errors.As(err, &me) || me.Relay != name {
		return err
	}
	eps := hostEndpoints(addrs, me.Port)
	if len(eps) == 0 {
		return err
	}
	return fmt.Errorf("%w\nrelay %q runs on this host, whose addresses are: endpoints: [%s] (keep those its peers can reach)", err, name, strings.Join(eps, ", "))
}

// hostEndpoints are the host's global unicast addresses with port, IPv4
// first, at most four.
func hostEndpoints(addrs func() ([]net.Addr, error), port int32) []string {
	list, err := addrs()
	if err != nil {
		return nil
	}
	var ips []netip.Addr
	for _, a := range list {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.IsGlobalUnicast() && !ip.IsLoopback() {
			ips = append(ips, ip)
		}
	}
	slices.SortStableFunc(ips, func(a, b netip.Addr) int {
		if a.Is4() != b.Is4() {
			if a.Is4() {
				return -1
			}
			return 1
		}
		return 0
	})
	var out []string
	for _, ip := range ips[:min(len(ips), 4)] {
		out = append(out, strconv.Quote(net.JoinHostPort(ip.String(), strconv.Itoa(int(port)))))
	}
	return out
}

// portHint adds the ways out to an error of a listener that could not
// bind: the port is another process's, or it needs a privilege.
func portHint(err error) error {
	switch {
	case err == nil:
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%w: another process holds the port ('ss -tulpn' shows which): stop it, or choose another port", err)
	case errors.Is(err, syscall.EACCES) && strings.Contains(err.Error(), "bind"):
		return fmt.Errorf("%w: ports below 1024 need root or CAP_NET_BIND_SERVICE: choose a port from 1024 up, or grant it (systemd: AmbientCapabilities=CAP_NET_BIND_SERVICE)", err)
	}
	return err
}
