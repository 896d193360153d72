//go:build linux

package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/netstack"
	rquic "github.com/hoplink/hoplink/relay/quic"
	"github.com/hoplink/hoplink/relay/tun"
)

// Packet mode. The entry and the exit of a tun Tunnel each own a device,
// and the IP packets that enter one leave by the other, over a session the
// entry keeps open to the exit. Over QUIC the packets ride datagrams, cut to
// MTU size first when the kernel handed over a super-packet, with the MSS of
// new TCP connections clamped so that their segments fit; a packet too large
// for a datagram rides the session's stream as a frame, so none is dropped
// for size. Over TLS the session is a byte stream of packet frames that keep
// their virtio-net header, so super-packets cross the chain whole when both
// devices take them. The exit checks every packet: from the Tunnel's
// sources, to its routes.

// packetDevice is one end's device, read and written in packet mode.
type packetDevice struct {
	dev    *tun.Device
	stats  *netstack.Stats
	mu     sync.Mutex // serializes writes
	closed atomic.Bool
	// queue holds plain packets (from QUIC datagrams, one each) for the
	// writer, which hands the kernel what has gathered in one go.
	queue chan []byte
	stop  chan struct{}
	done  chan struct{}
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

func newPacketDevice(dev *tun.Device, stats *netstack.Stats) *packetDevice {
	d := &packetDevice{dev: dev, stats: stats, queue: make(chan []byte, writeQueue),
		stop: make(chan struct{}), done: make(chan struct{})}
	go d.writer()
	return d
}

// close closes the device; reads in progress return an error, and closed
// tells them it is final.
func (d *packetDevice) close() {
	if d.closed.Swap(true) {
		return
	}
	close(d.stop)
	<-d.done
	d.dev.Close()
}

// enqueue hands a plain packet, which it takes over, to the writer. A full
// queue drops it, as a full NIC ring would: the flow's own congestion
// control answers the loss.
func (d *packetDevice) enqueue(pkt []byte) {
	select {
	case d.queue <- pkt:
	default:
		d.stats.Drop("queue_full")
	}
}

// writer writes queued packets: the first that arrives, with every other
// one waiting by then.
func (d *packetDevice) writer() {
	defer close(d.done)
	const offset = tun.VnetHdrLen     // room for the header GRO writes
	slots := make([][]byte, groSlots) // made when first needed: TLS sessions never do
	batch := make([][]byte, 0, groSlots)
	for {
		var pkt []byte
		select {
		case pkt = <-d.queue:
		case <-d.stop:
			return
		}
		batch = batch[:0]
		bytes := 0
		for {
			if offset+len(pkt) > groSlotBytes {
				d.write(zeroVnetHdr[:], pkt) // a jumbo frame: by itself
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
			case pkt = <-d.queue:
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
		if _, err := d.dev.Dev.Write(batch, offset); err != nil {
			d.stats.Drop("write_failed")
			continue
		}
		d.stats.Out(n, bytes)
	}
}

// batchSize bounds the packets one read of the device gathers, and
// batchBytes the memory they share: room for a few super-packets, or for
// batchSize MTU-sized packets, a quarter of what a buffer per packet
// would pin for each Tunnel end.
const (
	batchSize  = 64
	batchBytes = 4 * hop.MaxPacketFrame
)

// packetBatch holds packets read together, each with its virtio-net header
// (a zero one when the device has none), packed into one arena.
type packetBatch struct {
	arena []byte
	hdrs  [][]byte
	pkts  [][]byte
}

func newPacketBatch() *packetBatch {
	return &packetBatch{arena: make([]byte, batchBytes)}
}

// read waits for the device's next packet and takes every other one that
// is ready too, while the batch has room: under load, one wake-up and one
// send move many packets (most of a TCP flow's reverse direction is small
// ACKs).
func (d *packetDevice) read(b *packetBatch) error {
	sc, err := d.dev.File().SyscallConn()
	if err != nil {
		return err
	}
	b.hdrs, b.pkts = b.hdrs[:0], b.pkts[:0]
	// A read must have room for the largest packet the device may hand
	// over, or the kernel cuts it.
	room := hop.MaxPacketFrame
	if !d.dev.Offload && d.dev.MTU > 0 {
		room = tun.VnetHdrLen + d.dev.MTU
	}
	used := 0
	var rerr error
	err = sc.Read(func(fd uintptr) bool {
		for len(b.pkts) < batchSize && len(b.arena)-used >= room {
			buf := b.arena[used : used+room]
			off := 0
			if !d.dev.Offload {
				off = tun.VnetHdrLen
				clear(buf[:off])
			}
			n, err := unix.Read(int(fd), buf[off:])
			if err == unix.EAGAIN || err == unix.EINTR {
				return len(b.pkts) > 0 // wait for the first one, not for more
			}
			if err != nil {
				rerr = err
				return true
			}
			if off+n <= tun.VnetHdrLen {
				d.stats.Drop("malformed")
				continue
			}
			b.hdrs = append(b.hdrs, buf[:tun.VnetHdrLen:tun.VnetHdrLen])
			b.pkts = append(b.pkts, buf[tun.VnetHdrLen:off+n:off+n])
			used += off + n
		}
		return true
	})
	if err != nil {
		return err
	}
	return rerr
}

// write hands a packet to the kernel. A device with offload takes a
// super-packet as it is; one without gets it cut to size.
func (d *packetDevice) write(hdr, pkt []byte) {
	h, err := tun.ParseVnetHdr(hdr)
	if err != nil {
		d.stats.Drop("malformed")
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dev.Offload {
		if err := d.writev(hdr, pkt); err != nil {
			d.stats.Drop("write_failed")
			return
		}
		d.stats.Out(1, len(pkt))
		return
	}
	segs, err := tun.Complete(h, pkt, nil)
	if err != nil {
		d.stats.Drop("malformed")
		return
	}
	for _, s := range segs {
		if err := d.writev(s); err != nil {
			d.stats.Drop("write_failed")
			continue
		}
		d.stats.Out(1, len(s))
	}
}

// writev writes one packet from its parts, without joining them.
func (d *packetDevice) writev(parts ...[]byte) error {
	sc, err := d.dev.File().SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := sc.Write(func(fd uintptr) bool {
		_, werr = unix.Writev(int(fd), parts)
		return werr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return werr
}

var zeroVnetHdr [tun.VnetHdrLen]byte

// packetPeer sends packets to the other end of a session.
type packetPeer interface {
	send(hdr, pkt []byte) error
	// flush sends what send gathered; a peer may send at once instead.
	flush() error
}

// quicPeer sends over QUIC: plain packets with complete checksums, one
// datagram each (a frame on the stream when too large).
type quicPeer struct {
	out  *packetSender
	segs [][]byte
}

func (q *quicPeer) flush() error { return nil }

func (q *quicPeer) send(hdr, pkt []byte) error {
	h, err := tun.ParseVnetHdr(hdr)
	if err != nil {
		return err
	}
	if q.segs, err = tun.Complete(h, pkt, q.segs[:0]); err != nil {
		return err
	}
	var errs []error
	for _, s := range q.segs {
		if tun.IsSYN(s) {
			tun.ClampMSS(s, q.out.mss(s))
		}
		errs = append(errs, q.out.send(s))
	}
	return errors.Join(errs...)
}

// tlsPeer sends packet frames over a TLS stream, as super-packets when the
// other end takes them. Frames gather until flush, so that a batch of small
// packets costs one write.
type tlsPeer struct {
	w    io.Writer
	gso  bool
	buf  []byte
	segs [][]byte
}

// tlsFlushAt sends gathered frames once they pass this size.
const tlsFlushAt = 256 << 10

func (t *tlsPeer) send(hdr, pkt []byte) error {
	if t.gso {
		t.buf = hop.AppendPacketFrame(t.buf, hdr, pkt)
	} else {
		h, err := tun.ParseVnetHdr(hdr)
		if err != nil {
			return err
		}
		if t.segs, err = tun.Complete(h, pkt, t.segs[:0]); err != nil {
			return err
		}
		for _, s := range t.segs {
			t.buf = hop.AppendPacketFrame(t.buf, zeroVnetHdr[:], s)
		}
	}
	if len(t.buf) >= tlsFlushAt {
		return t.flush()
	}
	return nil
}

func (t *tlsPeer) flush() error {
	if len(t.buf) == 0 {
		return nil
	}
	_, err := t.w.Write(t.buf)
	t.buf = t.buf[:0]
	return err
}

// Session flags, one byte each way at the start of a TLS session.
const flagTakesGSO = 1

func gsoFlag(d *packetDevice) byte {
	if d.dev.Offload {
		return flagTakesGSO
	}
	return 0
}

// errDeviceGone ends a packet entry whose device was deleted under it.
var errDeviceGone = errors.New("the device is gone")

// packetEntry keeps a packet-mode Tunnel's session to its exit, and pumps
// the entry device into it.
type packetEntry struct {
	failures tun.ReadFailures
	r        *Relay
	t        *v1alpha1.Tunnel
	key      string
	dev      *packetDevice
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
}

func (r *Relay) startPacketEntry(t *v1alpha1.Tunnel, key string, dev *tun.Device, stats *netstack.Stats) (stop func()) {
	p := &packetEntry{r: r, t: t, key: key, dev: newPacketDevice(dev, stats), done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(r.ctx)
	go p.run()
	return func() {
		p.cancel()
		p.dev.close() // ends a read in progress
		<-p.done
	}
}

// run opens sessions one after another, with backoff, until stopped.
func (p *packetEntry) run() {
	defer close(p.done)
	backoff := 100 * time.Millisecond
	for p.ctx.Err() == nil {
		start := time.Now()
		err := p.session()
		if p.ctx.Err() != nil {
			return
		}
		if errors.Is(err, errDeviceGone) {
			p.dev.stats.Drop("device_gone")
			p.r.cfg.Log.Error("the device of a packet-mode Tunnel is gone; it carries nothing until the relay reopens it", "tunnel", p.key, "err", err)
			return
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		p.r.cfg.Log.Warn("packet session ended", "tunnel", p.key, "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		case <-p.ctx.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// session runs one session to the exit until it or the device ends.
func (p *packetEntry) session() error {
	r := p.r
	ctx, cancel := r.setupContext()
	defer cancel()
	chain := r.set.Load().ChainOf(p.t)
	if chain == nil {
		return errors.New("the Tunnel's chain is gone")
	}
	route, err := r.routeOf(ctx, chain)
	if err != nil {
		return err
	}
	if len(route) < 2 {
		return errors.New("packet mode needs an exit other than the entry")
	}
	h := &hop.Header{Kind: hop.KindPacket, Tunnel: p.key, Route: route[1:]}
	var peer packetPeer
	ended := make(chan struct{})
	if chain.Spec.Transport == v1alpha1.TransportTLS {
		out, err := r.nextHopEnd(ctx, h, v1alpha1.TransportTLS)
		if err != nil {
			return err
		}
		defer out.abort()
		flags, err := exchangeFlags(out, gsoFlag(p.dev), time.Now().Add(r.cfg.SetupTimeout))
		if err != nil {
			return fmt.Errorf("exit did not answer: %w", err)
		}
		peer = &tlsPeer{w: out, gso: flags&flagTakesGSO != 0}
		go func() {
			defer close(ended)
			receiveFrames(out, p.dev)
		}()
	} else {
		conn, st, err := r.nextHop(ctx, h)
		if err != nil {
			return err
		}
		defer resetStream(st, hop.CodeReset)
		out := newPacketSender(conn, st)
		conn.Register(out.id, p.dev.enqueue)
		defer conn.Unregister(out.id)
		peer = &quicPeer{out: out}
		go func() {
			defer close(ended)
			readFrames(st, func(pkt []byte) { p.dev.enqueue(slices.Clone(pkt)) })
		}()
	}
	cancel()
	r.cfg.Log.Info("packet session open", "tunnel", p.key, "route", route, "transport", chain.Spec.Transport)
	u := p.t.Spec.TUN
	prefix, _ := netip.ParsePrefix(u.Address)
	batch := newPacketBatch()
	f := p.dev.dev.File()
	for {
		select {
		case <-ended:
			return errors.New("the exit ended the session")
		case <-p.ctx.Done():
			return p.ctx.Err()
		default:
		}
		f.SetReadDeadline(time.Now().Add(time.Second)) // to notice the session's end
		err := p.dev.read(batch)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if p.failures.Gone(err) {
			return fmt.Errorf("%w: %v", errDeviceGone, err)
		}
		if err != nil {
			continue
		}
		for i, pkt := range batch.pkts {
			p.dev.stats.In(1, len(pkt))
			_, dst, err := tun.Addresses(pkt)
			if err != nil {
				p.dev.stats.Drop("not_ip")
				continue
			}
			// The kernel routes only the Tunnel's routes and prefix here.
			if !prefix.Masked().Contains(dst) && !manifest.PrefixesHold(u.Routes, dst) {
				p.dev.stats.Drop("not_routed")
				continue
			}
			if err := peer.send(batch.hdrs[i], pkt); err != nil {
				p.dev.stats.Drop("send_failed")
			}
		}
		if err := peer.flush(); err != nil {
			return err
		}
	}
}

// exchangeFlags sends this end's session flags and reads the other's.
func exchangeFlags(c end, mine byte, deadline time.Time) (byte, error) {
	if _, err := c.Write([]byte{mine}); err != nil {
		return 0, err
	}
	var b [1]byte
	if d, ok := c.(interface{ SetReadDeadline(time.Time) error }); ok {
		d.SetReadDeadline(deadline)
		defer d.SetReadDeadline(time.Time{})
	}
	_, err := io.ReadFull(c, b[:])
	return b[0], err
}

// receiveFrames writes the packet frames of a TLS session to a device until
// the session ends.
func receiveFrames(r io.Reader, d *packetDevice) error {
	buf := make([]byte, hop.MaxPacketFrame)
	for {
		hdr, pkt, err := hop.ReadPacketFrame(r, buf)
		if err != nil {
			return err
		}
		d.write(hdr, pkt)
	}
}

// packetExit is a packet-mode Tunnel's exit: its device, and the sessions of
// the entries, each of which receives the replies to the sources it sent
// from.
type packetExit struct {
	t      *v1alpha1.Tunnel
	key    string
	log    *slog.Logger
	dev    *packetDevice
	prefix netip.Prefix // the device's
	done   chan struct{}

	mu      sync.Mutex
	sources map[netip.Addr]packetPeer // entry-side address -> session last heard from it
}

// maxExitSources bounds the addresses an exit remembers for its replies.
const maxExitSources = 4096

// openPacketExit opens the exit's device: its own address in the Tunnel's
// prefix, the sources routed back into it.
func (r *Relay) openPacketExit(t *v1alpha1.Tunnel, key string) (*packetExit, error) {
	u := t.Spec.TUN
	entryAddr, err := netip.ParsePrefix(u.Address)
	if err != nil {
		return nil, err
	}
	addr := netip.PrefixFrom(entryAddr.Addr().Next(), entryAddr.Bits())
	if u.ExitAddress != "" {
		if addr, err = netip.ParsePrefix(u.ExitAddress); err != nil {
			return nil, err
		}
	}
	var routes []netip.Prefix
	for _, s := range u.Sources {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, err
		}
		routes = append(routes, p)
	}
	dev, err := tun.Open(tun.Config{Name: u.Name, Address: addr, MTU: int(u.MTU), Routes: routes, Offload: !r.cfg.NoTUNOffload})
	if err != nil {
		return nil, err
	}
	x := &packetExit{t: t, key: key, log: r.cfg.Log, dev: newPacketDevice(dev, r.tunStats(key)), prefix: addr.Masked(),
		done: make(chan struct{}), sources: map[netip.Addr]packetPeer{}}
	go x.replies()
	sources := u.Sources
	if len(sources) == 0 {
		sources = []string{x.prefix.String()} // the device's own prefix: see fromSource
	}
	r.cfg.Log.Info("tun device up", "tunnel", key, "device", dev.Name, "address", addr, "sources", sources, "offload", dev.Offload)
	return x, nil
}

func (x *packetExit) close() {
	x.dev.close()
	<-x.done
}

// fromSource says whether a packet's source is on the entry's side.
func (x *packetExit) fromSource(a netip.Addr) bool {
	if len(x.t.Spec.TUN.Sources) == 0 {
		return x.prefix.Contains(a)
	}
	return manifest.PrefixesHold(x.t.Spec.TUN.Sources, a)
}

// admit says whether a packet from a session may go to the device: its
// source one of the Tunnel's, its destination one the Tunnel reaches. It
// learns which session the replies to that source go back on.
func (x *packetExit) admit(from packetPeer, pkt []byte) bool {
	src, dst, err := tun.Addresses(pkt)
	switch {
	case err != nil:
		x.dev.stats.Drop("not_ip")
		return false
	case !x.fromSource(src):
		x.dev.stats.Drop("not_source")
		return false
	case !x.prefix.Contains(dst) && !manifest.PrefixesHold(x.t.Spec.TUN.Routes, dst):
		x.dev.stats.Drop("not_routed")
		return false
	}
	x.mu.Lock()
	if x.sources[src] != from {
		if len(x.sources) >= maxExitSources {
			clear(x.sources) // rare: relearn from the traffic
		}
		x.sources[src] = from
	}
	x.mu.Unlock()
	return true
}

// forget drops a session that ended.
func (x *packetExit) forget(p packetPeer) {
	x.mu.Lock()
	for a, s := range x.sources {
		if s == p {
			delete(x.sources, a)
		}
	}
	x.mu.Unlock()
}

// replies sends what the device gives back to the session of its
// destination.
func (x *packetExit) replies() {
	defer close(x.done)
	batch := newPacketBatch()
	touched := map[packetPeer]bool{}
	var failures tun.ReadFailures
	for {
		err := x.dev.read(batch)
		if x.dev.closed.Load() {
			return
		}
		if failures.Gone(err) {
			x.dev.stats.Drop("device_gone")
			x.log.Error("the exit device is gone; the Tunnel's sessions get no replies until the relay reopens it", "tunnel", x.key, "err", err)
			return
		}
		if err != nil {
			continue
		}
		for i, pkt := range batch.pkts {
			x.dev.stats.In(1, len(pkt))
			_, dst, err := tun.Addresses(pkt)
			if err != nil {
				x.dev.stats.Drop("not_ip")
				continue
			}
			x.mu.Lock()
			peer := x.sources[dst]
			x.mu.Unlock()
			if peer == nil {
				x.dev.stats.Drop("no_session")
				continue
			}
			if err := peer.send(batch.hdrs[i], pkt); err != nil {
				x.dev.stats.Drop("send_failed")
			}
			touched[peer] = true
		}
		for peer := range touched {
			if err := peer.flush(); err != nil {
				x.dev.stats.Drop("send_failed")
			}
			delete(touched, peer)
		}
	}
}

// servePacketQUIC serves an entry's packet session over QUIC at the exit.
func (r *Relay) servePacketQUIC(c *rquic.Conn, s *quicgo.Stream, x *packetExit) {
	out := newPacketSender(c, s)
	peer := &quicPeer{out: out}
	c.Register(out.id, func(pkt []byte) {
		if x.admit(peer, pkt) {
			x.dev.enqueue(pkt)
		}
	})
	defer c.Unregister(out.id)
	defer x.forget(peer)
	readFrames(s, func(pkt []byte) { // until the entry ends the session
		if x.admit(peer, pkt) {
			x.dev.enqueue(slices.Clone(pkt))
		}
	})
	resetStream(s, hop.CodeReset)
}

// servePacketTLS serves an entry's packet session over TLS at the exit.
func (r *Relay) servePacketTLS(in end, x *packetExit) {
	defer in.abort()
	flags, err := exchangeFlags(in, gsoFlag(x.dev), time.Now().Add(r.cfg.SetupTimeout))
	if err != nil {
		return
	}
	peer := &tlsPeer{w: in, gso: flags&flagTakesGSO != 0}
	defer x.forget(peer)
	buf := make([]byte, hop.MaxPacketFrame)
	for {
		hdr, pkt, err := hop.ReadPacketFrame(in, buf)
		if err != nil {
			return
		}
		if x.admit(peer, pkt) {
			x.dev.write(hdr, pkt)
		}
	}
}

// packetExit returns the open exit device of a packet-mode Tunnel.
func (r *Relay) packetExit(key string) (*packetExit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x := r.exits[key]; x != nil {
		return x, nil
	}
	return nil, fmt.Errorf("this relay has no device for Tunnel %q (see its log for why)", key)
}

// syncPacketExits opens the devices of the packet-mode Tunnels this relay
// is the exit of, and closes those of Tunnels that went away or changed.
func (r *Relay) syncPacketExits(set *manifest.Set) {
	want := map[string]*v1alpha1.Tunnel{}
	for _, t := range set.Tunnels {
		c := set.ChainOf(t)
		if u := t.Spec.TUN; u != nil && u.Mode == v1alpha1.TunPacket && c != nil && c.Spec.Exit == r.cfg.Name {
			want[manifest.Key(t.Namespace, t.Name)] = t
		}
	}
	r.mu.Lock()
	var stale []*packetExit
	for key, x := range r.exits {
		if t := want[key]; t == nil || !equality.Semantic.DeepEqual(t.Spec, x.t.Spec) {
			stale = append(stale, x)
			delete(r.exits, key)
		}
	}
	r.mu.Unlock()
	for _, x := range stale {
		x.close()
	}
	for key, t := range want {
		r.mu.Lock()
		_, open := r.exits[key]
		r.mu.Unlock()
		if open {
			continue
		}
		x, err := r.openPacketExit(t, key)
		if err != nil {
			r.cfg.Log.Error("cannot open the exit device of a packet-mode Tunnel; its sessions are refused", "tunnel", key, "err", err)
			continue
		}
		r.mu.Lock()
		r.exits[key] = x
		r.mu.Unlock()
	}
}

// closePacketExits closes every exit device, at shutdown.
func (r *Relay) closePacketExits() {
	r.mu.Lock()
	exits := r.exits
	r.exits = map[string]*packetExit{}
	r.mu.Unlock()
	for _, x := range exits {
		x.close()
	}
}
