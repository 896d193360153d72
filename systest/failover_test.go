package systest

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// TestFailover kills (SIGKILL) the middle relay of a chain while a
// transfer crosses it, as a lost node would. The transfer fails within
// about the QUIC idle timeout (3 s) instead of hanging for 10 s and more;
// then a chain with a fixed route refuses new flows at once, and a routed
// chain carries them on another route within about a probe round (the
// round that finds the relay silent marks it down and moves the chain).
func TestFailover(t *testing.T) {
	bin := procs.Hoplink(t)
	target := testutil.SinkThenSource(t)
	dial := func(addr string) func() (net.Conn, error) {
		return func() (net.Conn, error) { return net.Dial("tcp", addr) }
	}

	t.Run("fixed route", func(t *testing.T) {
		n := procs.StartNet(t, bin, target, []string{"m"}, "{entry: hk, exit: la, via: [m], route: [hk, m, la], transport: quic}")
		done := make(chan error, 1)
		go func() { done <- slowExchange(n.Listen, 4<<20, 20*time.Second) }()
		time.Sleep(300 * time.Millisecond)
		killed := time.Now()
		n.Procs["m"].Process.Kill()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("a transfer through a killed relay completed")
			}
			if d := time.Since(killed); d > 5*time.Second {
				t.Errorf("the open transfer failed %v after its middle relay died, want within about 3s", d)
			}
		case <-time.After(8 * time.Second):
			t.Fatal("the open transfer still hangs 8s after its middle relay died")
		}
		took, err := refusedWithin(n.Listen)
		if err != nil {
			t.Fatalf("a new flow once the middle is known dead: %v", err)
		}
		if took > 200*time.Millisecond {
			t.Errorf("a new flow once the middle is known dead was refused after %v, want at once", took)
		}
	})

	// A middle that hangs (SIGSTOP: its kernel still acknowledges TCP, so
	// TLS flows would hang for good) costs its TLS flows two probe rounds.
	t.Run("hung middle over tls", func(t *testing.T) {
		n := procs.StartNet(t, bin, target, []string{"m"}, "{entry: hk, exit: la, via: [m], route: [hk, m, la], transport: tls}")
		done := make(chan error, 1)
		go func() { done <- slowExchange(n.Listen, 4<<20, 20*time.Second) }()
		time.Sleep(300 * time.Millisecond)
		stopped := time.Now()
		n.Procs["m"].Process.Signal(syscall.SIGSTOP)
		defer n.Procs["m"].Process.Signal(syscall.SIGCONT)
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("a transfer through a hung relay completed")
			}
			t.Logf("the open TLS transfer failed %v after its middle hung", time.Since(stopped))
		case <-time.After(12 * time.Second):
			t.Fatalf("the open TLS transfer still hangs 12s after its middle hung\n%s", n.Log("hk"))
		}
	})

	t.Run("routed", func(t *testing.T) {
		n := procs.StartNet(t, bin, target, []string{"m1", "m2"},
			"{entry: hk, exit: la, via: [m1, m2], mode: sum, route: [hk, m1, la], probe: {interval: 500ms}}")
		// A relay that has run a while: its QUIC link to m1 is up.
		testutil.WaitFor(t, "hk's link to m1", func() error {
			if !strings.Contains(n.Log("hk"), `msg="peer connected" relay=hk peer=m1`) {
				return errors.New("not connected yet")
			}
			return nil
		})
		killed := time.Now()
		n.Procs["m1"].Process.Kill()
		// Flows started before the entry noticed may fail, and one that
		// took the dead middle's QUIC connection fails only when that
		// connection times out (3 s). So a new flow starts every 100ms
		// whatever the earlier ones do: the chain has moved by the start
		// of the first flow that succeeds, and every flow started after
		// that one succeeds.
		type try struct {
			at  time.Duration
			err error
		}
		results := make(chan try, 64)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		moved, launched, got := time.Duration(-1), 0, []try{}
		for moved < 0 {
			select {
			case <-tick.C:
				if launched == 60 {
					t.Fatalf("no flow started within 6s of the middle's death succeeded\n%s", n.Log("hk"))
				}
				launched++
				at := time.Since(killed)
				go func() { results <- try{at, testutil.TCPExchange(dial(n.Listen), 10000)} }()
			case r := <-results:
				got = append(got, r)
				if r.err == nil {
					moved = r.at
				}
			}
		}
		for len(got) < launched {
			select {
			case r := <-results:
				got = append(got, r)
			case <-time.After(10 * time.Second):
				t.Fatalf("%d flows started after the death still hang 10s later", launched-len(got))
			}
		}
		for _, r := range got {
			switch {
			case r.err == nil && r.at < moved:
				moved = r.at
			case r.err != nil:
				t.Logf("a flow started %v after the death: %v", r.at, r.err)
			}
		}
		for _, r := range got {
			if r.err != nil && r.at > moved {
				t.Errorf("a flow started %v after the death, after the chain moved (%v), failed: %v", r.at, moved, r.err)
			}
		}
		t.Logf("flows succeed again from %v after the middle died", moved)
		if moved > 2*time.Second {
			t.Errorf("the routed chain took %v to carry flows again, want within about a probe interval (500ms) and its round\n%s", moved, n.Log("hk"))
		}
		for i := range 5 {
			if err := testutil.TCPExchange(dial(n.Listen), 10000); err != nil {
				t.Fatalf("flow %d after the chain moved: %v", i, err)
			}
		}
		if l := n.Log("hk"); !strings.Contains(l, "from=hk,m1,la") {
			t.Errorf("hk's log shows no move off m1:\n%s", l)
		}
	})
}
