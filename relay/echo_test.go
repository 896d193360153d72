package relay

import (
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
)

// A pinger hears its destination's replies, to its own requests only,
// whichever socket the relay may open: an unprivileged one where
// ping_group_range holds its group, even without CAP_NET_RAW; a raw one
// with CAP_NET_RAW where the range holds none; none with neither.
func TestPingerSockets(t *testing.T) {
	if os.Geteuid() != 0 {
		gate.Missing(t, "needs root (a network namespace of its own, and CAP_NET_RAW to drop)")
	}
	for _, c := range []struct {
		name   string
		groups string
		capRaw bool
		want   string // "unprivileged", "raw", or "" for no socket
	}{
		{"unprivileged socket without CAP_NET_RAW", "0 2147483647", false, "unprivileged"},
		{"raw socket where ping_group_range holds no group", "1 0", true, "raw"},
		{"no socket", "1 0", false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			inNamespace(t, c.groups, c.capRaw, func() {
				for _, a := range []string{"127.0.0.1", "::1"} {
					p, err := openPinger(netip.MustParseAddr(a))
					switch {
					case c.want == "" && err == nil:
						p.close()
						t.Errorf("%s: a socket with neither the group nor CAP_NET_RAW", a)
					case c.want == "" && !strings.Contains(err.Error(), "ping_group_range"):
						t.Errorf("%s: %v; want the error to name ping_group_range", a, err)
					case c.want == "":
					case err != nil:
						t.Errorf("%s: %v", a, err)
					case p.raw != (c.want == "raw"):
						p.close()
						t.Errorf("%s: raw %v; want a %s socket", a, p.raw, c.want)
					default:
						pingLoopback(t, p)
					}
				}
			})
		})
	}
}

// inNamespace runs f on a thread of its own, in a network namespace of its
// own (loopback up, ping_group_range groups) and with CAP_NET_RAW only if
// capRaw; the thread ends with it.
func inNamespace(t *testing.T, groups string, capRaw bool, f func()) {
	t.Helper()
	errs := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		errs <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return err
			}
			lo, err := netlink.LinkByName("lo")
			if err == nil {
				err = netlink.LinkSetUp(lo)
			}
			if err != nil {
				return err
			}
			if err := os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte(groups), 0); err != nil {
				return err
			}
			if !capRaw {
				hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
				var data [2]unix.CapUserData
				if err := unix.Capget(&hdr, &data[0]); err != nil {
					return err
				}
				data[0].Effective &^= 1 << unix.CAP_NET_RAW
				if err := unix.Capset(&hdr, &data[0]); err != nil {
					return err
				}
			}
			f()
			return nil
		}()
	}()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// pingLoopback pings p's destination and wants its reply, then closes
// p. It runs on inNamespace's thread, so it fails with Errorf alone.
func pingLoopback(t *testing.T, p *pinger) {
	t.Helper()
	got := make(chan uint16, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.receive(func(seq uint16, data []byte) {
			if string(data) == "hoplink" {
				got <- seq
			}
		}, func() bool { return false })
	}()
	defer func() { p.close(); <-done }()
	if err := p.send(7, []byte("hoplink")); err != nil {
		t.Errorf("%v: send: %v", p.dst, err)
		return
	}
	select {
	case seq := <-got:
		if seq != 7 {
			t.Errorf("%v: reply to seq %d; want 7", p.dst, seq)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("%v: no reply", p.dst)
	}
	// Its reply was passed on: the request waits no more.
	if p.wait.take(7) {
		t.Errorf("%v: a request still waits after its reply", p.dst)
	}
}

// A session waits on a bounded number of requests, each for a while.
func TestEchoWait(t *testing.T) {
	var w echoWait
	for seq := range uint16(maxOutstanding + 10) {
		w.add(seq)
	}
	if len(w.sent) > maxOutstanding {
		t.Fatalf("%d requests wait; at most %d may", len(w.sent), maxOutstanding)
	}
	if !w.take(maxOutstanding+9) || w.take(maxOutstanding+9) {
		t.Fatal("the last request's reply not passed on exactly once")
	}
	w.sent[1] = time.Now().Add(-2 * echoTimeout)
	if w.take(1) {
		t.Fatal("a reply after the timeout passed on")
	}
}
