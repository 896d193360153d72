// Package udpio moves a UDP Tunnel's datagrams to and from its client and
// target sockets in batches: recvmmsg at the entry, sendmmsg at the exit,
// so a relay pays one system call for many datagrams and the QUIC
// connection's datagram goroutine never waits on a socket.
package udpio

import (
	"net"
	"net/netip"
	"sync"

	"golang.org/x/net/ipv4"

	"github.com/hoplink/hoplink/relay/hop"
)

// Batch is how many datagrams one system call moves at most.
const Batch = 32

// readSlots is how many datagrams a Reader takes per call. Each slot can
// hold the largest datagram; the kernel touches only the pages a datagram
// fills, so idle slots cost address space, not memory.
const readSlots = 8

// Reader reads datagrams from an unconnected socket in batches.
type Reader struct {
	pc   *ipv4.PacketConn // x/net's batch calls serve IPv6 sockets too
	msgs []ipv4.Message
}

// NewReader reads c in batches.
func NewReader(c *net.UDPConn) *Reader {
	r := &Reader{pc: ipv4.NewPacketConn(c), msgs: make([]ipv4.Message, readSlots)}
	for i := range r.msgs {
		r.msgs[i].Buffers = [][]byte{make([]byte, hop.MaxFrame)}
	}
	return r
}

// Read waits for datagrams and hands each to deliver, with its sender.
// The datagram's bytes are valid only during the call.
func (r *Reader) Read(deliver func(p []byte, from netip.AddrPort)) error {
	n, err := r.pc.ReadBatch(r.msgs, 0)
	if err != nil {
		return err
	}
	for i := range r.msgs[:n] {
		m := &r.msgs[i]
		ua, ok := m.Addr.(*net.UDPAddr)
		if !ok {
			continue
		}
		deliver(m.Buffers[0][:m.N], ua.AddrPort())
	}
	return nil
}

// Writer writes datagrams to a connected socket off the caller's
// goroutine: Write queues a copy (bounded; a full queue drops) and a
// goroutine sends what is queued with one sendmmsg per Batch.
type Writer struct {
	pc      *ipv4.PacketConn
	onSent  func(bytes int)
	onError func()

	mu      sync.Mutex
	queue   [][]byte
	closed  bool
	wake    chan struct{}
	stopped chan struct{}
}

// MaxQueue bounds a Writer's queue: about 10 ms of 1,200-byte datagrams
// at 1 Gbit/s, beyond which the target's socket is not keeping up anyway.
const MaxQueue = 1024

var small = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// NewWriter writes to connected socket c; onSent counts each datagram
// sent, onError each the kernel refused.
func NewWriter(c *net.UDPConn, onSent func(bytes int), onError func()) *Writer {
	w := &Writer{pc: ipv4.NewPacketConn(c), onSent: onSent, onError: onError,
		wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go w.run()
	return w
}

// Write queues a copy of p. It reports false when the queue is full (the
// datagram is dropped) or the writer closed.
func (w *Writer) Write(p []byte) bool {
	var b []byte
	if len(p) <= 2048 {
		b = (*small.Get().(*[]byte))[:0]
	}
	b = append(b, p...)
	w.mu.Lock()
	if w.closed || len(w.queue) >= MaxQueue {
		w.mu.Unlock()
		recycle(b)
		return false
	}
	w.queue = append(w.queue, b)
	first := len(w.queue) == 1
	w.mu.Unlock()
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return true
}

func recycle(b []byte) {
	if cap(b) == 2048 {
		small.Put(&b)
	}
}

// Close stops the writer; datagrams still queued are dropped.
func (w *Writer) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	<-w.stopped
}

func (w *Writer) run() {
	defer close(w.stopped)
	msgs := make([]ipv4.Message, Batch)
	var taken [][]byte
	for range w.wake {
		for {
			w.mu.Lock()
			if w.closed {
				for _, b := range w.queue {
					recycle(b)
				}
				w.queue = nil
				w.mu.Unlock()
				return
			}
			// Take the queue whole and leave a fresh slice behind, so
			// Writes go on while this batch is sent.
			taken, w.queue = w.queue, taken[:0]
			w.mu.Unlock()
			if len(taken) == 0 {
				break
			}
			w.send(msgs, taken)
			for i, b := range taken {
				recycle(b)
				taken[i] = nil
			}
		}
	}
}

func (w *Writer) send(msgs []ipv4.Message, pkts [][]byte) {
	for len(pkts) > 0 {
		n := min(len(pkts), len(msgs))
		for i := range n {
			msgs[i].Buffers = pkts[i : i+1]
			msgs[i].N = 0
		}
		sent, err := w.pc.WriteBatch(msgs[:n], 0)
		for i := range sent {
			w.onSent(len(pkts[i]))
		}
		if err != nil || sent == 0 {
			// The first unsent datagram was refused (a full buffer, an ICMP
			// error reported late): drop it, go on with the rest.
			sent++
			w.onError()
		}
		pkts = pkts[min(sent, len(pkts)):]
	}
}
