package tlslink

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/hoplink/hoplink/internal/testing/testutil/gate"
	"github.com/hoplink/hoplink/metrics"
	"github.com/hoplink/hoplink/pki"
)

// TestLinksRunTheirCongestionControl: the connections an endpoint dials
// and the ones it accepts run the algorithm it was given, whatever the
// host's default, and SetCongestion changes it for the next ones.
func TestLinksRunTheirCongestionControl(t *testing.T) {
	requireRoot(t)
	ca, _ := pki.NewCA("test")
	m := metrics.New(prometheus.NewRegistry())
	accepted := make(chan string, 8)
	listen := func(name string, c Congestion) *Endpoint {
		id, _ := ca.Identity(name)
		e, err := Listen(Options{Name: name, Identity: id, Listen: "127.0.0.1:0", Spares: 1, Congestion: c,
			Peers: []string{"a", "b"},
			Upper: serveFunc(func(_ string, c *tls.Conn) {
				defer c.Close()
				// Spares are accepted before they carry a flow: report
				// the one that carries the flow.
				if _, err := c.Read(make([]byte, 1)); err == nil {
					accepted <- SocketCongestion(TCP(c.NetConn()))
				}
				io.Copy(io.Discard, c)
			}),
			Metrics: m, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	def := hostDefault(t)
	other := "reno"
	if def == "reno" {
		other = "cubic"
	}
	pinned := ChooseCongestion(other)
	if !pinned.Wanted() || pinned.Algorithm != other {
		t.Fatalf("pinning %s as root: %+v", other, pinned)
	}
	b := listen("b", pinned)
	a := listen("a", pinned)
	flow := func() (dialed, acc string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := a.Pools().Pool("b", []string{b.Addr().String()}).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { c.Close(); a.Done(c) }()
		c.Write([]byte("x"))
		return SocketCongestion(TCP(c.NetConn())), <-accepted
	}
	if d, acc := flow(); d != other || acc != other {
		t.Fatalf("host default %s, links pinned to %s: dialed %s, accepted %s", def, other, d, acc)
	}
	// Back to the host's default: spares made before keep theirs, so wait
	// for a connection made after.
	a.SetCongestion(Congestion{Want: "auto", Algorithm: def, Reason: CongestionNotAllowed})
	b.SetCongestion(Congestion{Want: "auto", Algorithm: def, Reason: CongestionNotAllowed})
	a.Pools().Pool("b", nil).drain()
	if d, acc := flow(); d != def || acc != def {
		t.Fatalf("links back on the host's default %s: dialed %s, accepted %s", def, d, acc)
	}
}

// TestChooseCongestionSaysWhy: what a relay runs when it cannot have what
// it wants, and the reason, for each way the kernel refuses.
func TestChooseCongestionSaysWhy(t *testing.T) {
	requireRoot(t)
	def := hostDefault(t)
	if c := ChooseCongestion("no_such_cc"); c.Reason != CongestionNotAvailable || c.Algorithm != def || !strings.Contains(c.Fix, "modprobe tcp_no_such_cc") {
		t.Errorf("an algorithm the kernel lacks: %+v", c)
	}
	if c := ChooseCongestion("auto"); c.Algorithm != "bbr" || c.Reason != CongestionAuto {
		t.Errorf("auto, as root: %+v", c)
	}
	// Without CAP_NET_ADMIN only the host's allowed list may be set: the
	// case of a relay in a pod, in a network namespace whose default is
	// the usual cubic. The list is the host's, so the test sets it for a
	// moment (tests of a package run one at a time).
	withAllowed(t, "reno cubic", func() {
		c := unprivileged(t, "cubic", func() Congestion { return ChooseCongestion("auto") })
		if c.Reason != CongestionNotAllowed || c.Algorithm != "cubic" || !strings.Contains(c.Fix, "tcp_allowed_congestion_control") {
			t.Errorf("auto, bbr not allowed: %+v", c)
		}
		c = unprivileged(t, "cubic", func() Congestion { return ChooseCongestion("reno") })
		if c.Reason != CongestionPinned || c.Algorithm != "reno" {
			t.Errorf("an allowed algorithm pinned: %+v", c)
		}
	})
	withAllowed(t, "reno cubic bbr", func() {
		if c := unprivileged(t, "cubic", func() Congestion { return ChooseCongestion("auto") }); c.Reason != CongestionAuto || c.Algorithm != "bbr" {
			t.Errorf("auto, bbr allowed: %+v", c)
		}
	})
}

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		gate.Missing(t, "needs root")
	}
}

func hostDefault(t *testing.T) string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

const allowedPath = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"

// withAllowed runs f with the host's allowed list set to list (only
// algorithms the kernel has), then puts the old one back.
func withAllowed(t *testing.T, list string, f func()) {
	old, err := os.ReadFile(allowedPath)
	if err != nil {
		t.Fatal(err)
	}
	avail, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, a := range strings.Fields(list) {
		if slices.Contains(strings.Fields(string(avail)), a) && !slices.Contains(keep, a) {
			keep = append(keep, a)
		}
	}
	if err := os.WriteFile(allowedPath, []byte(strings.Join(keep, " ")), 0); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(allowedPath, old, 0)
	f()
}

// unprivileged runs f on a thread of its own, in a network namespace of
// its own whose default congestion control is def, without CAP_NET_ADMIN
// (namespaces and capabilities are a thread's); the thread ends with it.
func unprivileged(t *testing.T, def string, f func() Congestion) Congestion {
	out := make(chan Congestion, 1)
	errs := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errs <- err
			return
		}
		if err := os.WriteFile("/proc/sys/net/ipv4/tcp_congestion_control", []byte(def), 0); err != nil {
			errs <- err
			return
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errs <- err
			return
		}
		data[0].Effective &^= 1 << unix.CAP_NET_ADMIN
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errs <- err
			return
		}
		out <- f()
	}()
	select {
	case c := <-out:
		return c
	case err := <-errs:
		t.Fatal(err)
	}
	return Congestion{}
}
