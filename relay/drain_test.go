package relay_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// Draining a local network lets an open flow finish and refuses new ones
// at once (the entry's listener is closed).
func TestLocalNetworkDrains(t *testing.T) {
	target := testutil.TCPServer(t, func(c *net.TCPConn) {
		io.Copy(c, c)
		c.CloseWrite()
	})
	port := testutil.FreePort(t)
	n, _, _ := network(t, 2, []string{"r0", "r1"}, testutil.TunnelSpec{Name: "t", Protocol: "tcp", Target: target, Port: port})
	c := testutil.DialTunnel(t, port)
	defer c.Close()
	if _, err := c.Write([]byte("before")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("echo before the drain: %v", err)
	}
	drained := make(chan int, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drained <- n.Drain(ctx)
	}()
	deadline := time.Now().Add(2 * time.Second)
	for {
		nc, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err != nil {
			break // refused: the listener closed
		}
		nc.Close()
		if time.Now().After(deadline) {
			t.Fatal("the entry still accepts 2 s into the drain")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-drained:
		t.Fatal("the drain ended with a flow open")
	case <-time.After(100 * time.Millisecond):
	}
	// The open flow still works, then ends: the drain ends with it.
	if _, err := c.Write([]byte("during")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "during" {
		t.Fatalf("the open flow during the drain: %q %v", b, err)
	}
	c.CloseWrite()
	io.Copy(io.Discard, c)
	select {
	case open := <-drained:
		if open != 0 {
			t.Errorf("the drain ended with %d flows open", open)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the drain did not end once the last flow did")
	}
}
