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
// The datagram's bytes are valid only during the call. more says the call
// filled every slot: more datagrams are likely waiting.
func (r *Reader) Read(deliver func(p []byte, from netip.AddrPort)) (more bool, err error) {
	n, err := r.pc.ReadBatch(r.msgs, 0)
	if err != nil {
		return false, err
	}
	for i := range r.msgs[:n] {
		m := &r.msgs[i]
		ua, ok := m.Addr.(*net.UDPAddr)
		if !ok {
			continue
		}
		deliver(m.Buffers[0][:m.N], ua.AddrPort())
	}
	return n == len(r.msgs), nil
}

// Writer writes datagrams to a connected socket off the caller's
// goroutine: Write queues a copy (bounded; a full queue drops) and a
// goroutine sends what is queued with one sendmmsg per Batch. Where the
// kernel segments UDP (GSO), a run of equal-sized datagrams goes as one
// message that the kernel cuts: on loopback that halves what each costs,
// since the stack is walked once per run instead of once per datagram.
type Writer struct {
	pc      *ipv4.PacketConn
	onSent  func(bytes int)
	onError func()
	gso     bool // the run goroutine's own: off for good once the kernel refuses a run

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
	w := &Writer{pc: ipv4.NewPacketConn(c), onSent: onSent, onError: onError, gso: gsoSupported(c),
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

// A GSO run: at most maxSegments datagrams and maxRun bytes in one send
// (the kernel's limits: 64 segments, and one IP datagram's worth).
const (
	maxSegments = 64
	maxRun      = 65000
)

// run is how many datagrams from the start of pkts the kernel can send as
// one GSO message: all of the first one's size, and a last that may be
// shorter.
func run(pkts [][]byte) int {
	size := len(pkts[0])
	if size == 0 {
		return 1
	}
	n, total := 1, size
	for n < len(pkts) && n < maxSegments && total+len(pkts[n]) <= maxRun && len(pkts[n]) <= size && len(pkts[n]) > 0 {
		total += len(pkts[n])
		n++
		if len(pkts[n-1]) < size {
			break
		}
	}
	return n
}

func (w *Writer) send(msgs []ipv4.Message, pkts [][]byte) {
	var oob [Batch * 32]byte // room for a UDP_SEGMENT message per slot
	for len(pkts) > 0 {
		n, taken := 0, 0
		for n < len(msgs) && taken < len(pkts) {
			k := 1
			if w.gso {
				k = run(pkts[taken:])
			}
			m := &msgs[n]
			m.Buffers, m.OOB, m.N = pkts[taken:taken+k], nil, 0
			if k > 1 {
				m.OOB = oob[n*32 : n*32+gsoSpace]
				putGSO(m.OOB, len(pkts[taken]))
			}
			taken += k
			n++
		}
		sent, err := w.pc.WriteBatch(msgs[:n], 0)
		sent = max(sent, 0) // -1 with an error
		done := 0
		for i := range sent {
			for _, b := range msgs[i].Buffers {
				w.onSent(len(b))
			}
			done += len(msgs[i].Buffers)
		}
		if err != nil || sent == 0 {
			if failed := msgs[sent].Buffers; len(failed) > 1 {
				// The kernel would not cut this run (a datagram above the
				// path MTU, no checksum offload): send datagrams one by
				// one from here on.
				w.gso = false
			} else {
				// The first unsent datagram was refused (a full buffer,
				// an ICMP error reported late): drop it, go on with the
				// rest.
				done++
				w.onError()
			}
		}
		pkts = pkts[min(done, len(pkts)):]
	}
}
