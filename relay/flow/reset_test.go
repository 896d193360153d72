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

// TestCleanEndWhileAWriteWaitsIsNoReset: the client sends its request and
// its FIN, reads the whole answer and its FIN, while the target is slow to
// read the request. The client's socket at the relay is then done both
// ways, cleanly, with the upload still writing: the stall watch must not
// take it for a reset, and every byte of the request must reach the target
// before a clean end.
func TestCleanEndWhileAWriteWaitsIsNoReset(t *testing.T) {
	for name, join := range joins {
		t.Run(name, func(t *testing.T) {
			// Small buffers towards the target, large ones from the
			// client: the request fits behind the client, not ahead.
			// (Not tiny towards the target: a receive buffer far below
			// the MSS makes its window updates wait on the persist timer.)
			client, target, _, _, done := joinedWith(t, join, func(client, in, out, target *net.TCPConn) {
				client.SetWriteBuffer(1 << 20)
				in.SetReadBuffer(1 << 20)
				out.SetWriteBuffer(16 << 10)
				target.SetReadBuffer(64 << 10)
			})

			request := bytes.Repeat([]byte("r"), 1<<20)
			wrote := make(chan error, 1)
			go func() {
				_, err := client.Write(request)
				if err == nil {
					err = client.CloseWrite()
				}
				wrote <- err
			}()
			if _, err := target.Write([]byte("answer")); err != nil {
				t.Fatal(err)
			}
			target.CloseWrite()
			client.SetReadDeadline(time.Now().Add(5 * time.Second))
			if got, err := io.ReadAll(client); err != nil || string(got) != "answer" {
				t.Fatalf("client read %q and %v, want the answer and a clean end", got, err)
			}
			select {
			case err := <-wrote:
				if err != nil {
					t.Fatalf("client's request: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the request did not fit behind the client")
			}
			// The upload is stuck writing; let the stall watch look.
			time.Sleep(stallCheck + stallCheck/2)
			target.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(target)
			if err != nil || !bytes.Equal(got, request) {
				t.Fatalf("target read %d bytes and %v, want %d and a clean end", len(got), err, len(request))
			}
			if err := <-done; err != nil {
				t.Fatalf("the flow ended with %v, want a clean end", err)
			}
		})
	}
}

// holdPacer holds every write until its flow is gone.
type holdPacer struct{ count }

func (p *holdPacer) Pace(_ int, gone func() bool) {
	for end := time.Now().Add(10 * time.Second); !gone() && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResetWhilePacedIsAReset: the client resets while its direction waits
// for its pacer with a request in hand. The pacer's look at the client's
// socket (gone) sees the reset; the flow must then end as a reset at the
// target, after or without the request, never as a clean end.
func TestResetWhilePacedIsAReset(t *testing.T) {
	for _, name := range []string{"join", "halves"} {
		join := joins[name]
		t.Run(name, func(t *testing.T) {
			client, in := pair(t)
			out, target := pair(t)
			done := make(chan error, 1)
			go func() { done <- join(in, out, &holdPacer{}, &count{}) }()
			if _, err := client.Write([]byte("request")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // read, and held by the pacer
			client.SetLinger(0)
			client.Close()
			target.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(target)
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("target read %q and then %v, want a reset", got, err)
			}
			if err := <-done; err == nil {
				t.Fatal("a reset flow reported a clean end")
			}
		})
	}
}

// TestResetDuringADownloadIsAReset: the client resets while the relay
// writes it a download it is not reading. The download's failed write
// takes the reset's error off the client's socket, and the upload then
// reads an end of stream: that must reach the target as a reset, never as
// the client's FIN. Two goroutines race for the error (on a loop, the
// order of one turn decides), so the flow runs several times. The target
// has handed its whole download to its buffers before, so that no write
// of its own takes the reset's error off its socket.
func TestResetDuringADownloadIsAReset(t *testing.T) {
	for name, join := range joins {
		t.Run(name, func(t *testing.T) {
			for i := range 20 {
				client, target, _, _, done := joinedWith(t, join, func(client, in, out, target *net.TCPConn) {
					client.SetReadBuffer(4 << 10)
					in.SetWriteBuffer(16 << 10)
					out.SetReadBuffer(1 << 20)
					target.SetWriteBuffer(1 << 20)
				})
				target.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := target.Write(make([]byte, 256<<10)); err != nil {
					t.Fatal(err)
				}
				client.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(client, make([]byte, 8<<10)); err != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond) // the relay's write to the client waits
				client.SetLinger(0)
				client.Close()
				target.SetReadDeadline(time.Now().Add(5 * time.Second))
				got, err := io.ReadAll(target)
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("run %d: target read %d bytes and then %v, want a reset", i, len(got), err)
				}
				if err := <-done; err == nil {
					t.Fatalf("run %d: a reset flow reported a clean end", i)
				}
			}
		})
	}
}
