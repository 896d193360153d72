package flow

import (
	"bytes"
	"errors"
	"io"
	"syscall"
	"testing"
	"time"
)

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
