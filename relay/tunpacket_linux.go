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
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hoplink/hoplink/adminapi"
	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/internal/logs"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/admit"
	"github.com/hoplink/hoplink/relay/egress"
	"github.com/hoplink/hoplink/relay/flow"
	"github.com/hoplink/hoplink/relay/hop"
	"github.com/hoplink/hoplink/relay/nexthop"
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
// devices take them. Both ends check every packet (admit.Packets).

// packetTunnels is packet mode in both roles: the entry's sessions, and the
// exit's devices with the sessions they serve.
type packetTunnels struct {
	*env
	hops      *nexthop.Hops
	routes    *routeBook
	noOffload bool

	mu    sync.Mutex
	exits map[string]*packetExit // by Tunnel key
}

// packetPeer sends packets to the other end of a session.
type packetPeer interface {
	send(hdr, pkt []byte) error
	// flush sends what send gathered; a peer may send at once instead.
	flush() error
}

// quicPeer sends over QUIC: plain packets with complete checksums, one
// datagram each (a frame on the stream when too large).
type quicPeer struct {
	out  nexthop.Session
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
			tun.ClampMSS(s, q.out.MSS(s))
		}
		errs = append(errs, q.out.Send(s))
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

var zeroVnetHdr [tun.VnetHdrLen]byte

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

func gsoFlag(d *tun.Device) byte {
	if d.Offload {
		return flagTakesGSO
	}
	return 0
}

// exchangeFlags sends this end's session flags and reads the other's.
func exchangeFlags(c flow.End, mine byte, deadline time.Time) (byte, error) {
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

// receiveFrames writes the packet frames of a TLS session to a device,
// those that admit lets through, until the session ends.
func receiveFrames(r io.Reader, d *tun.Device, admit func(pkt []byte) bool) error {
	buf := make([]byte, hop.MaxPacketFrame)
	for {
		hdr, pkt, err := hop.ReadPacketFrame(r, buf)
		if err != nil {
			return err
		}
		if admit(pkt) {
			d.Write(hdr, pkt)
		}
	}
}

// errDeviceGone ends a packet entry whose device was deleted under it.
var errDeviceGone = errors.New("the device is gone")

// packetEntry keeps a packet-mode Tunnel's session to its exit, and pumps
// the entry device into it.
type packetEntry struct {
	p        *packetTunnels
	t        *v1alpha1.Tunnel
	key      string
	rules    *admit.Packets
	dev      *tun.Device
	failures tun.ReadFailures
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
}

// openEntry opens a packet-mode Tunnel on its entry relay; stop ends its
// session and removes the device.
func (p *packetTunnels) openEntry(t *v1alpha1.Tunnel, key string, addr netip.Prefix, routes []netip.Prefix) (stop func(), err error) {
	rules, err := admit.NewPackets(t)
	if err != nil {
		return nil, err
	}
	dev, err := openDevice(p.env, t, key, addr, routes, p.noOffload)
	if err != nil {
		return nil, err
	}
	p.log.Info("tun device up", "tunnel", key, "device", dev.Name, "offload", dev.Offload)
	e := &packetEntry{p: p, t: t, key: key, rules: rules, dev: dev, done: make(chan struct{})}
	e.ctx, e.cancel = context.WithCancel(p.ctx)
	go e.run()
	return func() {
		e.cancel()
		dev.Close() // ends a read in progress
		<-e.done
	}, nil
}

// run opens sessions one after another, with backoff, until stopped.
func (e *packetEntry) run() {
	defer close(e.done)
	backoff := 100 * time.Millisecond
	for e.ctx.Err() == nil {
		start := time.Now()
		err := e.session()
		if e.ctx.Err() != nil {
			return
		}
		if errors.Is(err, errDeviceGone) {
			e.dev.Stats.Dropped("device_gone")
			e.p.log.Error("the device of a packet-mode Tunnel is gone; it carries nothing until the relay reopens it", "tunnel", e.key, "err", err)
			return
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		e.p.log.Warn("packet session ended", "tunnel", e.key, "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		case <-e.ctx.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// admit says whether a packet from the session may enter the entry's
// network (admit.Packets.IntoEntry), counting those that may not.
func (e *packetEntry) admit(pkt []byte) bool {
	if reason := e.rules.IntoEntry(pkt); reason != "" {
		e.dev.Stats.Dropped(reason)
		return false
	}
	return true
}

// session runs one session to the exit until it or the device ends.
func (e *packetEntry) session() error {
	p := e.p
	ctx, cancel := p.setupContext()
	defer cancel()
	chain, route, err := p.routes.routeOf(ctx, e.t)
	if err != nil {
		return err
	}
	if len(route) < 2 {
		return errors.New("packet mode needs an exit other than the entry")
	}
	h := &hop.Header{Kind: hop.KindPacket, Tunnel: e.key, Route: route[1:]}
	var peer packetPeer
	ended := make(chan struct{})
	next, err := p.hops.Open(ctx, h, nexthop.OpenOptions{Transport: chain.Spec.Transport})
	if err != nil {
		return err
	}
	// The transports carry packets differently (see packetPeer's kinds).
	transport := next.Transport
	if transport == v1alpha1.TransportTLS {
		out := next.Stream()
		defer out.Abort()
		flags, err := exchangeFlags(out, gsoFlag(e.dev), time.Now().Add(p.setupTimeout))
		if err != nil {
			return fmt.Errorf("exit did not answer: %w", err)
		}
		peer = &tlsPeer{w: out, gso: flags&flagTakesGSO != 0}
		go func() {
			defer close(ended)
			receiveFrames(out, e.dev, e.admit)
		}()
	} else {
		out := next.Session(nexthop.SessionOptions{Share: queueShare(e.t, e.key)})
		defer out.End(hop.CodeReset)
		out.Receive(func(pkt []byte) {
			if e.admit(pkt) {
				e.dev.Enqueue(pkt)
			}
		})
		peer = &quicPeer{out: out}
		go func() {
			defer close(ended)
			out.ReadFrames(func(pkt []byte) {
				if e.admit(pkt) {
					e.dev.Enqueue(slices.Clone(pkt))
				}
			}, nil)
		}()
	}
	cancel()
	p.log.Info("packet session open", "tunnel", e.key, "route", logs.Route(route), "transport", transport)
	batch := tun.NewBatch()
	f := e.dev.File()
	for {
		select {
		case <-ended:
			return errors.New("the exit ended the session")
		case <-e.ctx.Done():
			return e.ctx.Err()
		default:
		}
		f.SetReadDeadline(time.Now().Add(time.Second)) // to notice the session's end
		err := e.dev.ReadBatch(batch)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if e.failures.Gone(err) {
			return fmt.Errorf("%w: %v", errDeviceGone, err)
		}
		if err != nil {
			continue
		}
		for i, pkt := range batch.Pkts {
			if reason := e.rules.IntoSession(pkt); reason != "" {
				e.dev.Stats.Dropped(reason)
				continue
			}
			if err := peer.send(batch.Hdrs[i], pkt); err != nil {
				e.dev.Stats.Dropped("send_failed")
			}
		}
		if err := peer.flush(); err != nil {
			return err
		}
	}
}

// packetExit is a packet-mode Tunnel's exit: its device, and the sessions of
// the entries, each of which receives the replies to the sources it sent
// from.
type packetExit struct {
	t     *v1alpha1.Tunnel
	key   string
	log   *slog.Logger
	rules *admit.Packets
	dev   *tun.Device
	done  chan struct{}
	// egress refuses packets to the node (nil: none refused).
	egress *egress.Policy

	mu      sync.Mutex
	sources map[netip.Addr]packetPeer // entry-side address -> session last heard from it
}

// maxExitSources bounds the addresses an exit remembers for its replies.
const maxExitSources = 4096

// openExit opens the exit's device: its own address in the Tunnel's
// prefix, the sources routed back into it.
func (p *packetTunnels) openExit(t *v1alpha1.Tunnel, key string) (*packetExit, error) {
	rules, err := admit.NewPackets(t)
	if err != nil {
		return nil, err
	}
	dev, err := openDevice(p.env, t, key, rules.ExitAddress(), rules.SourceRoutes(), p.noOffload)
	if err != nil {
		return nil, err
	}
	x := &packetExit{t: t, key: key, log: p.log, rules: rules, dev: dev, done: make(chan struct{}), sources: map[netip.Addr]packetPeer{}, egress: p.egress}
	go x.replies()
	p.log.Info("tun device up", "tunnel", key, "device", dev.Name, "address", rules.ExitAddress(), "sources", rules.Sources(), "offload", dev.Offload)
	return x, nil
}

func (x *packetExit) close() {
	x.dev.Close()
	<-x.done
}

// admit says whether a packet from a session may go to the device, and
// learns which session the replies to its source go back on.
func (x *packetExit) admit(from packetPeer, pkt []byte) bool {
	src, reason := x.rules.IntoExit(pkt)
	if reason != "" {
		x.dev.Stats.Dropped(reason)
		return false
	}
	if x.egress != nil {
		// The routes may hold the node's addresses; the policy has the last word.
		if _, dst, err := tun.Addresses(pkt); err != nil || x.egress.Check(dst) != nil {
			x.dev.Stats.Dropped("egress_refused")
			return false
		}
	}
	if !src.IsValid() {
		return true // an ICMP error about a packet the Tunnel carried: nothing to learn
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
	batch := tun.NewBatch()
	touched := map[packetPeer]bool{}
	var failures tun.ReadFailures
	for {
		err := x.dev.ReadBatch(batch)
		if x.dev.Closed() {
			return
		}
		if failures.Gone(err) {
			x.dev.Stats.Dropped("device_gone")
			x.log.Error("the exit device is gone; the Tunnel's sessions get no replies until the relay reopens it", "tunnel", x.key, "err", err)
			return
		}
		if err != nil {
			continue
		}
		for i, pkt := range batch.Pkts {
			_, dst, err := tun.Addresses(pkt)
			if err != nil {
				x.dev.Stats.Dropped(admit.NotIP)
				continue
			}
			x.mu.Lock()
			peer := x.sources[dst]
			x.mu.Unlock()
			if peer == nil {
				x.dev.Stats.Dropped("no_session")
				continue
			}
			if err := peer.send(batch.Hdrs[i], pkt); err != nil {
				x.dev.Stats.Dropped("send_failed")
			}
			touched[peer] = true
		}
		for peer := range touched {
			if err := peer.flush(); err != nil {
				x.dev.Stats.Dropped("send_failed")
			}
			delete(touched, peer)
		}
	}
}

// exitFor returns the open exit of a packet-mode Tunnel.
func (p *packetTunnels) exitFor(key string) (*packetExit, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if x := p.exits[key]; x != nil {
		return x, nil
	}
	return nil, fmt.Errorf("this relay has no device for Tunnel %q (see its log for why)", key)
}

// serve serves an entry's packet session at the exit.
func (p *packetTunnels) serve(from *nexthop.Hop, x *packetExit) {
	if from.Transport == v1alpha1.TransportTLS {
		p.serveTLS(from.Stream(), x)
		return
	}
	out := from.Session(nexthop.SessionOptions{Share: queueShare(x.t, x.key)})
	peer := &quicPeer{out: out}
	out.Receive(func(pkt []byte) {
		if x.admit(peer, pkt) {
			x.dev.Enqueue(pkt)
		}
	})
	defer x.forget(peer)
	out.ReadFrames(func(pkt []byte) { // until the entry ends the session
		if x.admit(peer, pkt) {
			x.dev.Enqueue(slices.Clone(pkt))
		}
	}, nil)
	out.End(hop.CodeReset)
}

// serveTLS serves an entry's packet session over TLS at the exit: frames
// of packets, super-packets when both ends take them.
func (p *packetTunnels) serveTLS(in flow.End, x *packetExit) {
	defer in.Abort()
	flags, err := exchangeFlags(in, gsoFlag(x.dev), time.Now().Add(p.setupTimeout))
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
			x.dev.Write(hdr, pkt)
		}
	}
}

// sync opens the devices of the packet-mode Tunnels this relay is the exit
// of, and closes those of Tunnels that went away or changed.
func (p *packetTunnels) sync(set *manifest.Set) {
	want := map[string]*v1alpha1.Tunnel{}
	for _, t := range set.Tunnels {
		c := set.ChainOf(t)
		if u := t.Spec.TUN; u != nil && u.Mode == v1alpha1.TunPacket && c != nil && c.Spec.Exit == p.name {
			want[manifest.Key(t.Namespace, t.Name)] = t
		}
	}
	p.mu.Lock()
	var stale []*packetExit
	for key, x := range p.exits {
		if t := want[key]; t == nil || !equality.Semantic.DeepEqual(t.Spec, x.t.Spec) {
			stale = append(stale, x)
			delete(p.exits, key)
		}
	}
	p.mu.Unlock()
	for _, x := range stale {
		x.close()
	}
	for key, t := range want {
		p.mu.Lock()
		_, open := p.exits[key]
		p.mu.Unlock()
		if open {
			continue
		}
		x, err := p.openExit(t, key)
		if err != nil {
			p.log.Error("cannot open the exit device of a packet-mode Tunnel; its sessions are refused", "tunnel", key, "err", err)
			p.problems.add(adminapi.ProblemDevice, key, err.Error())
			continue
		}
		p.mu.Lock()
		p.exits[key] = x
		p.mu.Unlock()
	}
}

// close closes every exit device, at shutdown.
func (p *packetTunnels) close() {
	p.mu.Lock()
	exits := p.exits
	p.exits = map[string]*packetExit{}
	p.mu.Unlock()
	for _, x := range exits {
		x.close()
	}
}
