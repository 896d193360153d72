package relay_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay"
)

// A reload (Update with new manifests, as SIGHUP or a watch event gives)
// that changes one Tunnel closes and reopens that Tunnel's entry alone, and
// the flows open on it and on the others go on to their end: a flow is a
// connection the entry accepted, not its listener's.
func TestUpdateTouchesOnlyTheChangedTunnelAndKeepsFlows(t *testing.T) {
	oldTarget := testutil.EchoServer(t)
	// The new target says so before it echoes.
	newTarget := testutil.TCPServer(t, func(c *net.TCPConn) {
		c.Write([]byte("new\n"))
		testutil.Echo(c)
	})
	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ports := map[string]int{"changed": testutil.FreePort(t), "same": testutil.FreePort(t), "other": testutil.FreePort(t)}
	var specs []testutil.TunnelSpec
	for _, name := range []string{"changed", "same", "other"} {
		specs = append(specs, testutil.TunnelSpec{Name: name, Protocol: "tcp", Target: oldTarget, Port: ports[name]})
	}
	n, _, set := networkWith(t, relay.Config{Log: log}, "quic", 2, []string{"r0", "r1"}, specs...)

	// A flow on each Tunnel exchanges a message every few milliseconds
	// until stop, and says whether every echo came back whole.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, name := range []string{"changed", "same", "other"} {
		c := testutil.DialTunnel(t, ports[name])
		wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 64)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				msg := []byte(fmt.Sprintf("%s %06d ................................................", name, i))[:64]
				if _, err := c.Write(msg); err != nil {
					errs <- fmt.Errorf("flow on %s, message %d: %w", name, i, err)
					return
				}
				if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, msg) {
					errs <- fmt.Errorf("flow on %s, message %d: echo %q, %v", name, i, buf, err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)

	// The same objects, one Tunnel's target changed.
	relays, chains, tunnels := set.Objects()
	for i := range tunnels {
		if tunnels[i].Name == "changed" {
			tunnels[i].Spec.Target = newTarget
		}
	}
	next, problems := manifest.FromObjects(relays, chains, tunnels)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	before := len(logs.String())
	for _, r := range n.Relays {
		if err := r.Update(next); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	reload := logs.String()[before:]
	closed, opened := strings.Count(reload, `msg="tunnel closed"`), strings.Count(reload, `msg="tunnel open"`)
	touched := strings.Count(reload, "tunnel=default/changed")
	if closed != 1 || opened != 1 || touched != 2 || strings.Count(reload, "tunnel=default/") != 2 {
		t.Errorf("the reload closed %d entries and opened %d, want the changed Tunnel's alone:\n%s", closed, opened, reload)
	}
	// New flows on the changed Tunnel reach its new target.
	c := testutil.DialTunnel(t, ports["changed"])
	defer c.Close()
	c.Write([]byte("x"))
	hello := make([]byte, 4)
	if _, err := io.ReadFull(c, hello); err != nil || string(hello) != "new\n" {
		t.Errorf("a new flow on the changed Tunnel: %q, %v; want its new target", hello, err)
	}
}
