package flow

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// The ways a flow's joins are made, for tests that must hold for each: on
// an event loop (two sockets), a goroutine per direction, and spliced.
var joins = map[string]func(in, out *net.TCPConn, up, down Counter) error{
	"join":   viaJoin,
	"halves": viaHalves,
	"splice": viaSplice,
}

// TestClosedWhileOpenIsAReset: a relay process that dies has its sockets
// closed by the kernel. While the flow is open that must reach the client as
// a reset, never as a clean end of a stream cut short; once the relay ended
// its direction cleanly, every byte and then the FIN arrive.
func TestClosedWhileOpenIsAReset(t *testing.T) {
	t.Run("open", func(t *testing.T) {
		client, in := pair(t)
		if _, err := TCP(in); err != nil {
			t.Fatal(err)
		}
		in.Write([]byte("part of an answer"))
		in.Close() // what the kernel does to a killed relay's sockets
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(client)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client read %q and then %v, want a reset", got, err)
		}
	})
	t.Run("after a clean half-close", func(t *testing.T) {
		client, in := pair(t)
		e, err := TCP(in)
		if err != nil {
			t.Fatal(err)
		}
		answer := bytes.Repeat([]byte("a"), 1<<20)
		go func() {
			e.Write(answer)
			e.CloseWrite()
			in.Close()
		}()
		time.Sleep(100 * time.Millisecond) // let the close come before the reads
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(client)
		if err != nil || !bytes.Equal(got, answer) {
			t.Fatalf("client read %d bytes and %v, want %d and a clean end", len(got), err, len(answer))
		}
	})
}

// TestResetEndsAHalfStuckWriting: the client resets while the flow's upload
// is stuck writing to a target that stopped reading. Nothing reads the
// client's socket meanwhile, yet the flow must end at once, both ends reset,
// not wait for its idle timeout (none here).
func TestResetEndsAHalfStuckWriting(t *testing.T) {
	for name, join := range joins {
		t.Run(name, func(t *testing.T) {
			client, target, _, _, done := joined(t, join)
			// Fill the target's buffers and the relay's: the upload blocks.
			client.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
			chunk := make([]byte, 64<<10)
			for {
				if _, err := client.Write(chunk); err != nil {
					break
				}
			}
			client.SetLinger(0)
			client.Close()
			start := time.Now()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("a reset flow reported a clean end")
				}
			case <-time.After(4 * stallCheck):
				t.Fatal("the flow stayed open after its client reset")
			}
			t.Logf("ended %v after the reset", time.Since(start).Round(time.Millisecond))
			target.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, target); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("the target saw %v, want a reset", err)
			}
		})
	}
}
