//go:build linux

// Package tun owns the device of a tun Tunnel, as the one owner of its I/O:
// it creates it with wireguard-go's tun package (virtio-net headers with TCP
// segmentation offload, where the kernel allows it), gives it its address
// and routes over netlink, reads and writes it for both modes (packets one
// at a time for a stack, batches for packet mode, super-packets coalesced
// from single packets by a GRO writer), counts it in one Stats, and on Close
// removes it, and its routes with it. It also parses and completes the raw
// packets that cross a chain in packet mode.
package tun

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	wgtun "golang.zx2c4.com/wireguard/tun"
)

// Config describes a device.
type Config struct {
	Name    string
	Address netip.Prefix // the relay's own address, with the device's prefix
	MTU     int
	Routes  []netip.Prefix
	// Offload asks for virtio-net headers and segmentation offload, so that
	// the kernel hands over and takes 64 KiB super-packets. When it is off,
	// or the kernel refuses it, the device moves MTU-sized packets.
	Offload bool
	// Stats counts what the device reads, writes and drops.
	Stats *Stats
}

// Device is an open TUN device with its address and routes.
type Device struct {
	// Dev reads and writes batches of packets (wireguard-go splits the
	// kernel's super-packets on read and coalesces on write).
	Dev  wgtun.Device
	Name string
	// Offload reports whether the device has virtio-net headers.
	Offload bool
	// MTU bounds the packets of a device without offload.
	MTU int
	// Stats counts what the device reads, writes and drops.
	Stats *Stats

	io deviceIO
}

// Open creates and configures the device. The errors name what the relay
// lacks: /dev/net/tun, or CAP_NET_ADMIN.
func Open(c Config) (*Device, error) {
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return nil, fmt.Errorf("TUN device %s: /dev/net/tun is missing: load the tun module (modprobe tun) and, in a container, mount the device: %w", c.Name, err)
	}
	d := &Device{Name: c.Name, MTU: c.MTU, Stats: c.Stats}
	var err error
	if c.Offload {
		if d.Dev, err = wgtun.CreateTUN(c.Name, c.MTU); err == nil {
			d.Offload = true
			// TCP segmentation only: the kernel's UDP super-packets would
			// have to be cut into their datagrams before anything else
			// could read them, and hoplink moves super-packets whole.
			if err = tcpOffloadOnly(d.Dev.File()); err != nil {
				d.Dev.Close()
				d.Dev, d.Offload = nil, false
			}
		}
	}
	if d.Dev == nil {
		// Without offload, or where the kernel refused it: plain packets.
		d.Dev, err = createPlain(c.Name, c.MTU)
	}
	if err != nil {
		return nil, privileges(c.Name, err)
	}
	if err := configure(c); err != nil {
		d.Dev.Close()
		return nil, privileges(c.Name, err)
	}
	return d, nil
}

func tcpOffloadOnly(f *os.File) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := sc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6)
	}); err != nil {
		return err
	}
	return ierr
}

// createPlain opens a TUN device without virtio-net headers.
func createPlain(name string, mtu int) (wgtun.Device, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return wgtun.CreateTUNFromFile(os.NewFile(uintptr(fd), "/dev/net/tun"), mtu)
}

// configure gives the device its address, brings it up and routes the
// prefixes into it.
func configure(c Config) error {
	link, err := netlink.LinkByName(c.Name)
	if err != nil {
		return fmt.Errorf("find device: %w", err)
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(c.Address)}); err != nil {
		return fmt.Errorf("address %s: %w", c.Address, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	for _, r := range c.Routes {
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: ipNet(r), Scope: netlink.SCOPE_LINK}
		if err := netlink.RouteAdd(route); err != nil {
			return fmt.Errorf("route %s: %w", r, err)
		}
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// privileges explains the errors a relay without enough privileges gets.
func privileges(name string, err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("TUN device %s: %w: the relay needs CAP_NET_ADMIN (run it as root, or grant the capability; in Kubernetes, securityContext.capabilities.add: [NET_ADMIN])", name, err)
	}
	if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("TUN device %s: %w: the name, an address or a route is taken already", name, err)
	}
	return fmt.Errorf("TUN device %s: %w", name, err)
}

// File is the device's file.
func (d *Device) File() *os.File { return d.Dev.File() }

// ReadFailures tells a read loop when its device is gone: a device that
// was deleted (ip link del, its namespace removed) fails every read, with
// errors that vary by kernel, where a live one fails a read now and then.
type ReadFailures struct{ n int }

// maxReadFailures in a row mean the device is gone.
const maxReadFailures = 16

// Gone records a read's error (nil for a good read) and reports whether
// the loop should end.
func (f *ReadFailures) Gone(err error) bool {
	if err == nil {
		f.n = 0
		return false
	}
	if errors.Is(err, os.ErrClosed) || errors.Is(err, unix.EBADFD) {
		return true
	}
	f.n++
	return f.n >= maxReadFailures
}
