package faults

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// pattern fills b with the stream's bytes from offset off. Each 8-byte
// block is a hash of its index, so a lost, repeated or shifted run of
// bytes differs from what belongs at its offset.
func pattern(b []byte, off int64) {
	var blk [8]byte
	for len(b) > 0 {
		i := off / 8
		x := uint64(i) + 0x9e3779b97f4a7c15
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(blk[:], x^x>>31)
		n := copy(b, blk[off%8:])
		b, off = b[n:], off+int64(n)
	}
}

// tagLen is the header a client writes first: which transfer (or readiness
// probe) the connection belongs to, since the target also accepts
// connections left over from probes that gave up.
const tagLen = 8

// targets is the target application's listener: it hands each connection
// to whoever expects its tag.
type targets struct {
	ln   net.Listener
	mu   sync.Mutex
	next uint64
	want map[uint64]chan net.Conn
}

func listenTargets() (*targets, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &targets{ln: ln, want: map[uint64]chan net.Conn{}}
	go t.serve()
	return t, nil
}

func (t *targets) addr() string { return t.ln.Addr().String() }

func (t *targets) close() { t.ln.Close() }

func (t *targets) serve() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			var tag [tagLen]byte
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, tag[:]); err != nil {
				c.Close()
				return
			}
			c.SetReadDeadline(time.Time{})
			t.mu.Lock()
			ch := t.want[binary.BigEndian.Uint64(tag[:])]
			delete(t.want, binary.BigEndian.Uint64(tag[:]))
			t.mu.Unlock()
			if ch == nil {
				c.Close()
				return
			}
			ch <- c
		}()
	}
}

// expect returns a new tag and where its connection will arrive.
func (t *targets) expect() ([]byte, chan net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	ch := make(chan net.Conn, 1)
	t.want[t.next] = ch
	return binary.BigEndian.AppendUint64(nil, t.next), ch
}

// forget drops a tag whose connection never came, and closes it if it
// came after all.
func (t *targets) forget(tag []byte, ch chan net.Conn) {
	t.mu.Lock()
	delete(t.want, binary.BigEndian.Uint64(tag))
	t.mu.Unlock()
	select {
	case c := <-ch:
		c.Close()
	default:
	}
}

// probe sends a few bytes to the target through dial and reads them back:
// the chain carries flows.
func (t *targets) probe(dial func() (net.Conn, error)) error {
	tag, ch := t.expect()
	defer t.forget(tag, ch)
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(append(tag, "ping"...)); err != nil {
		return err
	}
	var tc net.Conn
	select {
	case tc = <-ch:
	case <-time.After(3 * time.Second):
		return errors.New("the target got no connection")
	}
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(3 * time.Second))
	var b [4]byte
	if _, err := io.ReadFull(tc, b[:]); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if _, err := tc.Write(b[:]); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if string(b[:]) != "ping" {
		return fmt.Errorf("the probe came back as %q", b[:])
	}
	return nil
}

// app is one application's view of the flow: the first end it saw, and
// the first error after a clean end.
type app struct {
	mu     sync.Mutex
	at     time.Time
	how    How
	err    string
	then   string
	frozen bool // the measurement is over: what comes now is our own teardown
}

func (a *app) saw(how How, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.frozen:
	case a.how == "":
		a.at, a.how = time.Now(), how
		if err != nil {
			a.err = err.Error()
		}
	case a.how == Clean && how == Reset && errors.Is(err, syscall.ECONNRESET) && a.then == "":
		// A reset that finds the socket open (after a FIN it would be
		// EPIPE) wakes a blocked writer and the reader together, and the
		// kernel gives its error to one: the other reads a plain end of
		// stream. That end was the reset.
		a.how, a.err = Reset, err.Error()+", with an end of stream read beside it"
	case a.how == Clean && how == Reset && a.then == "":
		a.then = fmt.Sprintf("reset %v later (%v)", time.Since(a.at).Round(time.Millisecond), err)
	}
}

func (a *app) ended() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.how != ""
}

func (a *app) end(killed time.Time) End {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.frozen = true
	if a.how == "" {
		return End{How: None}
	}
	return End{How: a.how, After: a.at.Sub(killed), Err: a.err, Then: a.then}
}

// readEnd records how a read ended: EOF is clean, any other error a reset.
func (a *app) readEnd(err error) {
	if errors.Is(err, io.EOF) {
		a.saw(Clean, nil)
	} else {
		a.saw(Reset, fmt.Errorf("read: %w", err))
	}
}

// transfer runs c's transfer between a client that dials through the
// relays and the target behind them, calls kill at c.KillAfter, and
// reports what each application saw until both ended or c's Wait passed.
func transfer(ctx context.Context, t *targets, dial func() (net.Conn, error), c Case, kill func() error) (Result, error) {
	res := Result{Case: c}
	tag, ch := t.expect()
	defer t.forget(tag, ch)
	cc, err := dial()
	if err != nil {
		return res, fmt.Errorf("dial the Tunnel: %w", err)
	}
	defer cc.Close()
	if _, err := cc.Write(tag); err != nil {
		return res, fmt.Errorf("client: %w", err)
	}
	var tc net.Conn
	select {
	case tc = <-ch:
	case <-time.After(10 * time.Second):
		return res, errors.New("the target got no connection within 10 s")
	case <-ctx.Done():
		return res, ctx.Err()
	}
	defer tc.Close()

	var client, target app
	snd, rcv, sApp, rApp := cc, tc, &client, &target
	if c.Direction == "download" {
		snd, rcv, sApp, rApp = tc, cc, &target, &client
	}
	var wg sync.WaitGroup
	var sent, received int64
	var differs bool
	start := time.Now()
	wg.Add(3)
	stop := make(chan struct{})
	go func() { // the sender's writes, paced
		defer wg.Done()
		sent = sendPaced(snd, c.Size, c.Pace, start, sApp, stop)
	}()
	go func() { // the sender reads too: that is where it sees the other side close
		defer wg.Done()
		buf := make([]byte, 16<<10)
		for {
			if _, err := snd.Read(buf); err != nil {
				sApp.readEnd(err)
				return
			}
		}
	}()
	go func() { // the receiver checks every byte, and closes at its end as applications do
		defer wg.Done()
		received, differs = receive(rcv, rApp)
		rcv.Close()
	}()

	select {
	case <-time.After(time.Until(start.Add(c.KillAfter))):
	case <-ctx.Done():
	}
	// The clock starts as the signal is sent: an end may come before
	// kill returns.
	killed := time.Now()
	killErr := kill()
	deadline := time.NewTimer(c.wait())
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	// Once both ended, a little longer: an application that saw a clean
	// end may see an error just after, and that is worth telling apart.
	var grace <-chan time.Time
wait:
	for {
		select {
		case <-tick.C:
			if grace == nil && client.ended() && target.ended() {
				grace = time.After(time.Second)
			}
		case <-grace:
			break wait
		case <-deadline.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	res.Client, res.Target = client.end(killed), target.end(killed)
	close(stop)
	cc.Close()
	tc.Close()
	wg.Wait()
	res.Sent, res.Received, res.Differs = sent, received, differs
	if killErr != nil {
		return res, fmt.Errorf("kill the %s: %w", c.Role, killErr)
	}
	return res, ctx.Err()
}

// sendPaced writes size bytes of the pattern, spread evenly from start
// over pace, then half-closes; it returns how many bytes its writes took.
// It gives up when stop closes.
func sendPaced(c net.Conn, size int64, pace time.Duration, start time.Time, a *app, stop <-chan struct{}) int64 {
	const chunk = 32 << 10
	buf := make([]byte, chunk)
	var off int64
	for off < size {
		due := start.Add(time.Duration(float64(pace) * float64(off) / float64(size)))
		select {
		case <-time.After(time.Until(due)):
		case <-stop:
			return off
		}
		n := min(int64(chunk), size-off)
		pattern(buf[:n], off)
		w, err := c.Write(buf[:n])
		off += int64(w)
		if err != nil {
			a.saw(Reset, fmt.Errorf("write: %w", err))
			return off
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		a.saw(Reset, fmt.Errorf("half-close: %w", err))
	}
	return off
}

// receive reads to the end, checking each byte against the pattern.
func receive(c net.Conn, a *app) (n int64, differs bool) {
	buf := make([]byte, 64<<10)
	want := make([]byte, len(buf))
	for {
		k, err := c.Read(buf)
		if k > 0 {
			pattern(want[:k], n)
			if !bytes.Equal(buf[:k], want[:k]) {
				differs = true
			}
			n += int64(k)
		}
		if err != nil {
			a.readEnd(err)
			return n, differs
		}
	}
}
