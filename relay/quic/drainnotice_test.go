package quic

import (
	"context"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/pki"
	"github.com/hoplink/hoplink/relay/hop"
)

// A peer's drain news counts for the peer only on its link: an extra
// connection made with its certificate, with or without an admitted
// stream, cannot make the relay stop sending flows to a peer whose own
// link says nothing of a drain. The connection that said so is treated
// as drained itself (a done notice closes it), and every notice is
// counted.
func TestDrainNoticeFromAnExtraConnection(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	admitted := make(chan *Conn, 8)
	a := testEndpointWith(t, ca, "a", func(c *Conn, s *quicgo.Stream) {
		c.Admitted() // what the relay's dispatcher does once a header passes
		s.CancelRead(0)
		s.Close()
		admitted <- c
	})
	b := testEndpoint(t, ca, "b", nil)
	told := make(chan string, 4)
	upperOf(a).draining = func(peer string) { told <- peer }
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	link, err := a.Links().Link("b", Control, []string{b.Addr().String()}).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	notices := func(result string) float64 {
		return promtest.ToFloat64(a.opts.Metrics.DrainNotices.WithLabelValues("a", "b", result))
	}
	heard := func() float64 { return notices("ignored") + notices("honoured") }
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			if ctx.Err() != nil {
				t.Fatalf("%s: not within the test's time", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	bID, _ := ca.Identity("b")
	drain := hop.AppendDatagram(nil, hop.DrainFlow, nil)
	done := hop.AppendDatagram(nil, hop.DoneFlow, nil)
	// A fresh connection as b that carried nothing: a drain and a done.
	fresh, err := quicgo.DialAddr(ctx, a.Addr().String(), bID.ClientConfig("a"), &quicgo.Config{EnableDatagrams: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.CloseWithError(0, "")
	fresh.SendDatagram(drain)
	fresh.SendDatagram(done)
	waitFor("the notices on the fresh connection counted", func() bool { return heard() == 1 })
	select {
	case <-fresh.Context().Done(): // done, with no flow on it: closed
	case <-ctx.Done():
		t.Fatal("a done notice did not close the connection it came on")
	}

	// A connection as b that carried an admitted stream, while a's own
	// link to b is up and says nothing.
	busy, err := quicgo.DialAddr(ctx, a.Addr().String(), bID.ClientConfig("a"), &quicgo.Config{EnableDatagrams: true})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.CloseWithError(0, "")
	s, err := busy.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{0})
	select {
	case <-admitted:
	case <-ctx.Done():
		t.Fatal("the stream was never served")
	}
	busy.SendDatagram(drain)
	waitFor("the notice on the admitted connection counted", func() bool { return heard() == 2 })

	if a.PeerDraining("b") || link.Draining() {
		t.Fatal("extra connections made a healthy peer count as draining")
	}
	select {
	case p := <-told:
		t.Fatalf("told that %s drains", p)
	default:
	}
	if v := notices("ignored"); v != 2 {
		t.Fatalf("ignored notices = %v, want 2", v)
	}

	// b itself drains: its news on a's link counts.
	b.Drain()
	select {
	case p := <-told:
		if p != "b" {
			t.Fatalf("told %q drains", p)
		}
	case <-ctx.Done():
		t.Fatal("a never learned that b drains")
	}
	if !a.PeerDraining("b") || notices("honoured") != 1 {
		t.Fatalf("after b drained: draining %v, honoured %v", a.PeerDraining("b"), notices("honoured"))
	}
}

// Without a link of its own to a peer, a relay takes the peer's drain news
// from a connection that carried the peer's admitted flows, and still not
// from one that carried none.
func TestDrainNoticeOnAnAdmittedConnection(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	admitted := make(chan *Conn, 8)
	a := testEndpointWith(t, ca, "a", func(c *Conn, s *quicgo.Stream) {
		c.Admitted()
		s.CancelRead(0)
		s.Close()
		admitted <- c
	})
	told := make(chan string, 4)
	upperOf(a).draining = func(peer string) { told <- peer }
	c, d := testEndpoint(t, ca, "c", nil), testEndpoint(t, ca, "d", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// c sends a a flow on a Tunnel's link; d only keeps its control link.
	_, s, err := c.Links().Link("a", "default/t", []string{a.Addr().String()}).OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{0})
	select {
	case <-admitted:
	case <-ctx.Done():
		t.Fatal("c's stream was never served")
	}
	if _, err := d.Links().Link("a", Control, []string{a.Addr().String()}).Conn(ctx); err != nil {
		t.Fatal(err)
	}

	d.Drain()
	notices := a.opts.Metrics.DrainNotices
	for promtest.ToFloat64(notices.WithLabelValues("a", "d", "ignored"))+promtest.ToFloat64(notices.WithLabelValues("a", "d", "honoured")) < 1 {
		if ctx.Err() != nil {
			t.Fatal("d's notice was never counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if a.PeerDraining("d") {
		t.Fatal("a connection that carried no admitted flow made its peer count as draining")
	}
	c.Drain()
	select {
	case p := <-told:
		if p != "c" {
			t.Fatalf("told %q drains", p)
		}
	case <-ctx.Done():
		t.Fatal("a never learned that c drains")
	}
	if !a.PeerDraining("c") {
		t.Fatal("c does not count as draining")
	}
}
