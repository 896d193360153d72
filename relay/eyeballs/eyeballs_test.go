package eyeballs

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func aps(t *testing.T, s ...string) []netip.AddrPort {
	t.Helper()
	out := make([]netip.AddrPort, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddrPort(a)
	}
	return out
}

func TestOrderInterleavesFamiliesIPv6First(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"ipv4 only keeps its order", "10.0.0.2:1 10.0.0.1:1", "10.0.0.2:1 10.0.0.1:1"},
		{"ipv6 only keeps its order", "[fd00::2]:1 [fd00::1]:1", "[fd00::2]:1 [fd00::1]:1"},
		{"dual: ipv6 first", "10.0.0.1:1 [fd00::1]:1", "[fd00::1]:1 10.0.0.1:1"},
		{"two pods, dual", "10.0.0.1:1 10.0.0.2:1 [fd00::1]:1 [fd00::2]:1", "[fd00::1]:1 10.0.0.1:1 [fd00::2]:1 10.0.0.2:1"},
		{"more of one family", "10.0.0.1:1 10.0.0.2:1 10.0.0.3:1 [fd00::1]:1", "[fd00::1]:1 10.0.0.1:1 10.0.0.2:1 10.0.0.3:1"},
		{"mapped is ipv4, repeats dropped", "[::ffff:10.0.0.1]:1 10.0.0.1:1 [::1]:1 [::1]:1", "[::1]:1 10.0.0.1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Order(aps(t, strings.Fields(tc.in)...))
			var s []string
			for _, a := range got {
				s = append(s, a.String())
			}
			if strings.Join(s, " ") != tc.want {
				t.Errorf("Order(%s) = %s, want %s", tc.in, strings.Join(s, " "), tc.want)
			}
		})
	}
}

func TestFamily(t *testing.T) {
	for _, tc := range []struct {
		a    net.Addr
		want string
	}{
		{&net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}, IPv4},
		{&net.UDPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 1}, IPv4},
		{&net.UDPAddr{IP: net.ParseIP("::1"), Port: 1}, IPv6},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0", Port: 1}, IPv6},
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 1}, IPv4},
		{&net.UnixAddr{Name: "/x"}, ""},
		{nil, ""},
	} {
		if got := FamilyOf(tc.a); got != tc.want {
			t.Errorf("FamilyOf(%v) = %q, want %q", tc.a, got, tc.want)
		}
	}
}

func TestReachable(t *testing.T) {
	for _, tc := range []struct {
		local, remote string
		want          bool
	}{
		{"::", "10.0.0.1", true},
		{"::", "fd00::1", true},
		{"0.0.0.0", "fd00::1", true}, // Go binds 0.0.0.0 dual-stack too
		{"10.0.0.5", "10.0.0.1", true},
		{"10.0.0.5", "fd00::1", false},
		{"fd00::5", "10.0.0.1", false},
		{"fd00::5", "::ffff:10.0.0.1", false},
		{"::ffff:10.0.0.5", "10.0.0.1", true},
		{"fd00::5", "fd00::1", true},
	} {
		if got := Reachable(netip.MustParseAddr(tc.local), netip.MustParseAddr(tc.remote)); got != tc.want {
			t.Errorf("Reachable(%s, %s) = %v, want %v", tc.local, tc.remote, got, tc.want)
		}
	}
	if !Reachable(netip.Addr{}, netip.MustParseAddr("::1")) {
		t.Error("an unknown local address must not rule a remote out")
	}
}

type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func TestResolve(t *testing.T) {
	r := fakeResolver{"dual.example": {netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")},
		"v6.example": {netip.MustParseAddr("fd00::2")}, "mapped.example": {netip.MustParseAddr("::ffff:10.0.0.3")}}
	got, err := Resolve(context.Background(), r, []string{"[fd00::9]:7401", "192.0.2.1:7401", "dual.example:7401",
		"v6.example:7402", "mapped.example:1", "gone.example:7401", "no-port"})
	want := aps(t, "[fd00::9]:7401", "192.0.2.1:7401", "10.0.0.1:7401", "[fd00::1]:7401", "[fd00::2]:7402", "10.0.0.3:1")
	if !slices.Equal(got, want) {
		t.Errorf("Resolve = %v, want %v", got, want)
	}
	if err == nil || !strings.Contains(err.Error(), "gone.example:7401") || !strings.Contains(err.Error(), "no-port") {
		t.Errorf("Resolve's error %v should name the endpoints that gave nothing", err)
	}
}

// dialer is a fake dial whose outcome per address is set: after how long
// it answers, and whether it fails; it records when each attempt started.
type dialer struct {
	mu      sync.Mutex
	started map[netip.AddrPort]time.Duration
	t0      time.Time
	after   map[netip.AddrPort]time.Duration
	fail    map[netip.AddrPort]bool
}

func (d *dialer) dial(ctx context.Context, a netip.AddrPort) (netip.AddrPort, error) {
	d.mu.Lock()
	d.started[a] = time.Since(d.t0)
	d.mu.Unlock()
	wait, ok := d.after[a]
	if !ok {
		<-ctx.Done() // a dead address: nothing ever answers
		return netip.AddrPort{}, ctx.Err()
	}
	select {
	case <-time.After(wait):
	case <-ctx.Done():
		return netip.AddrPort{}, ctx.Err()
	}
	if d.fail[a] {
		return netip.AddrPort{}, errors.New(a.String() + ": refused")
	}
	return a, nil
}

func TestRace(t *testing.T) {
	v6, v4, v6b := netip.MustParseAddrPort("[::1]:1"), netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("[::2]:1")
	for _, tc := range []struct {
		name    string
		addrs   []netip.AddrPort
		after   map[netip.AddrPort]time.Duration
		fail    map[netip.AddrPort]bool
		want    netip.AddrPort
		took    time.Duration
		started map[netip.AddrPort]time.Duration
	}{
		{name: "ipv6 answers first: ipv4 never tried",
			addrs: []netip.AddrPort{v6, v4}, after: map[netip.AddrPort]time.Duration{v6: 10 * time.Millisecond, v4: time.Millisecond},
			want: v6, took: 10 * time.Millisecond, started: map[netip.AddrPort]time.Duration{v6: 0}},
		{name: "ipv6 dead: ipv4 a delay later",
			addrs: []netip.AddrPort{v6, v4}, after: map[netip.AddrPort]time.Duration{v4: 5 * time.Millisecond},
			want: v4, took: Delay + 5*time.Millisecond, started: map[netip.AddrPort]time.Duration{v6: 0, v4: Delay}},
		{name: "ipv6 refused: ipv4 at once",
			addrs: []netip.AddrPort{v6, v4}, after: map[netip.AddrPort]time.Duration{v6: time.Millisecond, v4: time.Millisecond},
			fail: map[netip.AddrPort]bool{v6: true}, want: v4, took: 2 * time.Millisecond,
			started: map[netip.AddrPort]time.Duration{v6: 0, v4: time.Millisecond}},
		{name: "ipv6 slow but first: the later ipv4 loses",
			addrs: []netip.AddrPort{v6, v4}, after: map[netip.AddrPort]time.Duration{v6: 300 * time.Millisecond, v4: 100 * time.Millisecond},
			want: v6, took: 300 * time.Millisecond, started: map[netip.AddrPort]time.Duration{v6: 0, v4: Delay}},
		{name: "ipv4 answers before a slow ipv6",
			addrs: []netip.AddrPort{v6, v4}, after: map[netip.AddrPort]time.Duration{v6: time.Second, v4: 10 * time.Millisecond},
			want: v4, took: Delay + 10*time.Millisecond, started: map[netip.AddrPort]time.Duration{v6: 0, v4: Delay}},
		{name: "two dead, the third answers",
			addrs: []netip.AddrPort{v6, v4, v6b}, after: map[netip.AddrPort]time.Duration{v6b: 0},
			want: v6b, took: 2 * Delay, started: map[netip.AddrPort]time.Duration{v6: 0, v4: Delay, v6b: 2 * Delay}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &dialer{started: map[netip.AddrPort]time.Duration{}, t0: time.Now(), after: tc.after, fail: tc.fail}
				got, at, err := Race(context.Background(), tc.addrs, Delay, d.dial, nil)
				took := time.Since(d.t0)
				if err != nil || got != tc.want || at != tc.want {
					t.Fatalf("Race = %v at %v, %v; want %v", got, at, err, tc.want)
				}
				if took != tc.took {
					t.Errorf("took %v, want %v", took, tc.took)
				}
				synctest.Wait()
				d.mu.Lock()
				defer d.mu.Unlock()
				if len(d.started) != len(tc.started) {
					t.Errorf("attempts started %v, want %v", d.started, tc.started)
				}
				for a, w := range tc.started {
					if s, ok := d.started[a]; !ok || s != w {
						t.Errorf("%v started at %v (%v), want %v", a, s, ok, w)
					}
				}
			})
		})
	}
}

func TestRaceAllFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v6, v4 := netip.MustParseAddrPort("[::1]:1"), netip.MustParseAddrPort("127.0.0.1:1")
		d := &dialer{started: map[netip.AddrPort]time.Duration{}, t0: time.Now(),
			after: map[netip.AddrPort]time.Duration{v6: time.Millisecond, v4: time.Millisecond},
			fail:  map[netip.AddrPort]bool{v6: true, v4: true}}
		_, _, err := Race(context.Background(), []netip.AddrPort{v6, v4}, Delay, d.dial, nil)
		if err == nil || err.Error() != "[::1]:1: refused\n127.0.0.1:1: refused" {
			t.Errorf("err = %v, want both attempts' errors in address order", err)
		}
		if _, _, err := Race(context.Background(), nil, Delay, d.dial, nil); !errors.Is(err, ErrNoAddress) {
			t.Errorf("no address: err = %v", err)
		}
	})
}

// A loser that connects all the same is handed back to be closed, not
// leaked.
func TestRaceDiscardsLateWinner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v6, v4 := netip.MustParseAddrPort("[::1]:1"), netip.MustParseAddrPort("127.0.0.1:1")
		var mu sync.Mutex
		var discarded []netip.AddrPort
		// Neither honours cancellation: the ipv4 attempt ends connected.
		dial := func(_ context.Context, a netip.AddrPort) (netip.AddrPort, error) {
			if a == v6 {
				time.Sleep(Delay + time.Millisecond)
			} else {
				time.Sleep(10 * time.Millisecond)
			}
			return a, nil
		}
		got, _, err := Race(context.Background(), []netip.AddrPort{v6, v4}, Delay, dial, func(a netip.AddrPort) {
			mu.Lock()
			discarded = append(discarded, a)
			mu.Unlock()
		})
		if err != nil || got != v6 {
			t.Fatalf("Race = %v, %v; want %v", got, err, v6)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(discarded, []netip.AddrPort{v4}) {
			t.Errorf("discarded %v, want the ipv4 connection", discarded)
		}
	})
}

// A race called off by its caller starts no more attempts and ends with
// the pending ones.
func TestRaceCalledOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		addrs := aps(t, "[::1]:1", "127.0.0.1:1", "[::2]:1")
		d := &dialer{started: map[netip.AddrPort]time.Duration{}, t0: time.Now()} // nothing answers
		ctx, cancel := context.WithTimeout(context.Background(), Delay+Delay/2)
		defer cancel()
		_, _, err := Race(ctx, addrs, Delay, d.dial, nil)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want the caller's deadline", err)
		}
		if took := time.Since(d.t0); took != Delay+Delay/2 {
			t.Errorf("ended after %v, want at the deadline", took)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.started) != 2 {
			t.Errorf("attempts %v, want the two started before the deadline", d.started)
		}
	})
}
