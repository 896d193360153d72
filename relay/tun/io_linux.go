//go:build linux

package tun

import (
	"errors"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// deviceIO is the state of a device's I/O beyond the kernel's.
type deviceIO struct {
	mu     sync.Mutex // serializes direct writes
	closed atomic.Bool

	// The GRO writer, started by the first Enqueue.
	start  sync.Once
	queue  chan []byte
	stop   chan struct{}
	done   chan struct{}
	writer bool
}

// Close stops the writer and removes the device; the kernel removes its
// address and routes with it. Reads in progress return an error, and
// Closed tells them it is final.
func (d *Device) Close() error {
	if d.io.closed.Swap(true) {
		return nil
	}
	d.io.start.Do(func() {}) // no writer starts from now on
	if d.io.writer {
		close(d.io.stop)
		<-d.io.done
	}
	return d.Dev.Close()
}

// Closed reports whether Close was called.
func (d *Device) Closed() bool { return d.io.closed.Load() }

// MaxRead is the room a read needs: a virtio-net header and the largest
// packet the device hands over.
const MaxRead = VnetHdrLen + 65535

// ReadPacket reads one packet into buf (at least MaxRead bytes) and returns
// it without its virtio-net header, and the header's GSO type (GSONone on a
// device without offload).
func (d *Device) ReadPacket(buf []byte) (gso uint8, pkt []byte, err error) {
	n, err := d.File().Read(buf)
	if err != nil {
		return 0, nil, err
	}
	if !d.Offload {
		return GSONone, buf[:n], nil
	}
	if n < VnetHdrLen {
		d.Stats.Dropped("malformed")
		return 0, nil, nil
	}
	return buf[1], buf[VnetHdrLen:n], nil
}

// WritePacket writes one packet from its parts, without joining them: hdr
// is its virtio-net header (nil for none, which a device with offload gets
// as zeros), left off on a device without offload.
func (d *Device) WritePacket(hdr []byte, parts ...[]byte) error {
	iovs := make([][]byte, 0, 1+len(parts))
	if d.Offload {
		if hdr == nil {
			hdr = zeroVnetHdr[:]
		}
		iovs = append(iovs, hdr)
	}
	size := 0
	for _, p := range parts {
		iovs = append(iovs, p)
		size += len(p)
	}
	if err := d.writev(iovs); err != nil {
		d.Stats.Dropped("write_failed")
		return err
	}
	d.Stats.Wrote(1, size)
	return nil
}

var zeroVnetHdr [VnetHdrLen]byte

func (d *Device) writev(iovs [][]byte) error {
	sc, err := d.File().SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := sc.Write(func(fd uintptr) bool {
		_, werr = unix.Writev(int(fd), iovs)
		return werr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return werr
}

// DropBadVnetHdr counts packets whose virtio-net header asks the kernel for
// what the packet cannot be (RebuildVnetHdr).
const DropBadVnetHdr = "bad_vnet_hdr"

// Write hands a packet with its virtio-net header to the kernel. A device
// with offload takes a super-packet whole, under a header rebuilt from the
// packet; one without gets it cut to size, with complete checksums.
func (d *Device) Write(hdr, pkt []byte) {
	h, err := ParseVnetHdr(hdr)
	if err != nil {
		d.Stats.Dropped("malformed")
		return
	}
	d.io.mu.Lock()
	defer d.io.mu.Unlock()
	if d.Offload {
		// The header came from a peer: the kernel gets one rebuilt from
		// the packet, or none.
		if h, err = RebuildVnetHdr(h, pkt); err != nil {
			d.Stats.Dropped(DropBadVnetHdr)
			return
		}
		var b [VnetHdrLen]byte
		d.WritePacket(h.Encode(b[:]), pkt)
		return
	}
	segs, err := Complete(h, pkt, nil)
	if err != nil {
		d.Stats.Dropped("malformed")
		return
	}
	for _, s := range segs {
		d.WritePacket(nil, s)
	}
}

// Packets from datagrams arrive one at a time; the writer coalesces those
// of a TCP flow into super-packets (GRO, as wireguard-go's tun does it)
// when the device has offload. writeQueue bounds what waits for it,
// groSlots the packets of one write, groSlotBytes the super-packet they may
// become.
const (
	writeQueue   = 512
	groSlots     = 32
	groSlotBytes = 32 << 10
)

// Enqueue hands a plain packet, which it takes over, to the writer. A full
// queue drops it, as a full NIC ring would: the flow's own congestion
// control answers the loss, and the connection that carries every other
// flow never stalls.
func (d *Device) Enqueue(pkt []byte) {
	d.io.start.Do(func() {
		d.io.queue = make(chan []byte, writeQueue)
		d.io.stop, d.io.done = make(chan struct{}), make(chan struct{})
		d.io.writer = true
		go d.writer()
	})
	if !d.io.writer {
		return // closed
	}
	select {
	case d.io.queue <- pkt:
	default:
		d.Stats.Dropped("queue_full")
	}
}

// writer writes queued packets: the first that arrives, with every other
// one waiting by then.
func (d *Device) writer() {
	defer close(d.io.done)
	const offset = VnetHdrLen         // room for the header GRO writes
	slots := make([][]byte, groSlots) // made when first needed
	batch := make([][]byte, 0, groSlots)
	for {
		var pkt []byte
		select {
		case pkt = <-d.io.queue:
		case <-d.io.stop:
			return
		}
		batch = batch[:0]
		bytes := 0
		for {
			if offset+len(pkt) > groSlotBytes {
				d.Write(zeroVnetHdr[:], pkt) // a jumbo frame: by itself
			} else {
				if slots[len(batch)] == nil {
					slots[len(batch)] = make([]byte, groSlotBytes)
				}
				b := slots[len(batch)][:offset+len(pkt)]
				copy(b[offset:], pkt)
				batch = append(batch, b)
				bytes += len(pkt)
			}
			if len(batch) == groSlots {
				break
			}
			select {
			case pkt = <-d.io.queue:
				continue
			default:
			}
			break
		}
		if len(batch) == 0 {
			continue
		}
		// GRO grows the first packet of a run in its slot and drops the
		// rest from the write; the counts are of the packets as they came.
		n := len(batch)
		if _, err := d.Dev.Write(batch, offset); err != nil {
			d.Stats.Dropped("write_failed")
			continue
		}
		d.Stats.Wrote(n, bytes)
	}
}

// batchSize bounds the packets one read of the device gathers, and
// batchBytes the memory they share: room for a few super-packets, or for
// batchSize MTU-sized packets, a quarter of what a buffer per packet
// would pin for each Tunnel end.
const (
	batchSize  = 64
	batchBytes = 4 * MaxRead
)

// Batch holds packets read together, each with its virtio-net header (a
// zero one when the device has none), packed into one arena.
type Batch struct {
	arena []byte
	Hdrs  [][]byte
	Pkts  [][]byte
}

// NewBatch makes a batch; reuse it for every read.
func NewBatch() *Batch { return &Batch{arena: make([]byte, batchBytes)} }

// ReadBatch waits for the device's next packet and takes every other one
// that is ready too, while the batch has room: under load, one wake-up and
// one send move many packets (most of a TCP flow's reverse direction is
// small ACKs). It counts what it read.
func (d *Device) ReadBatch(b *Batch) error {
	sc, err := d.File().SyscallConn()
	if err != nil {
		return err
	}
	b.Hdrs, b.Pkts = b.Hdrs[:0], b.Pkts[:0]
	// A read must have room for the largest packet the device may hand
	// over, or the kernel cuts it.
	room := MaxRead
	if !d.Offload && d.MTU > 0 {
		room = VnetHdrLen + d.MTU
	}
	used := 0
	var rerr error
	err = sc.Read(func(fd uintptr) bool {
		for len(b.Pkts) < batchSize && len(b.arena)-used >= room {
			buf := b.arena[used : used+room]
			off := 0
			if !d.Offload {
				off = VnetHdrLen
				clear(buf[:off])
			}
			n, err := unix.Read(int(fd), buf[off:])
			if err == unix.EAGAIN || err == unix.EINTR {
				return len(b.Pkts) > 0 // wait for the first one, not for more
			}
			if err != nil {
				rerr = err
				return true
			}
			if off+n <= VnetHdrLen {
				d.Stats.Dropped("malformed")
				continue
			}
			b.Hdrs = append(b.Hdrs, buf[:VnetHdrLen:VnetHdrLen])
			b.Pkts = append(b.Pkts, buf[VnetHdrLen:off+n:off+n])
			used += off + n
		}
		return true
	})
	for _, p := range b.Pkts {
		d.Stats.Read(1, len(p))
	}
	return errors.Join(err, rerr)
}
