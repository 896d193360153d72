package relay

import (
	"net/netip"
	"testing"

	"github.com/hoplink/hoplink/relay/hop"
)

// TestSessionEndedWhileConnecting: a UDP session may end (evicted, its
// entry closing) while it connects. Whichever of end and connect comes
// second closes what connect opened; before, end read the next relay's
// session while connect wrote it, and one that ended first left that
// session open at the next relay until its idle timeout.
func TestSessionEndedWhileConnecting(t *testing.T) {
	newSession := func() *udpSession {
		return &udpSession{u: &udpEntry{sessions: map[netip.AddrPort]*udpSession{}}, queue: make(chan []byte, 1), done: func() {}}
	}
	t.Run("ended first", func(t *testing.T) {
		s := newSession()
		s.end(hop.CodeIdle)
		var closed []hop.Code
		if !s.closeOnEnd(func(c hop.Code) { closed = append(closed, c) }) {
			t.Error("connect goes on with a session that ended")
		}
		if len(closed) != 1 {
			t.Errorf("closed %d times, want once", len(closed))
		}
	})
	t.Run("connected first", func(t *testing.T) {
		s := newSession()
		var closed []hop.Code
		if s.closeOnEnd(func(c hop.Code) { closed = append(closed, c) }) {
			t.Fatal("connect stops for a session that has not ended")
		}
		s.end(hop.CodeIdle)
		if len(closed) != 1 || closed[0] != hop.CodeIdle {
			t.Errorf("end closed with %v, want [idle]", closed)
		}
	})
}
