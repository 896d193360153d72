// Command metricsflood measures what unauthenticated connections to a
// relay's metrics port cost it. It starts one relay (`hoplink local` with
// --metrics-addr on loopback) and reads its resident memory idle. Then
// worker processes (each holds at most -per-worker, under the descriptor
// limit) open -conns connections from -sources loopback addresses: each
// sends one request and keeps its connection open and idle (-mode
// keepalive), or sends nothing (-mode silent). While they stay, it samples
// the relay's RSS every 500 ms and asks /healthz on a new connection every
// second from another address (-probe-from), as a kubelet would. It prints
// the idle and peak RSS, how many connections were answered and how many
// were still open after -hold, and the probes that failed.
//
//	go run ./hack/bench/metricsflood -hoplink bin/hoplink
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/testing/freeport"
)

func main() {
	bin := flag.String("hoplink", "bin/hoplink", "the hoplink binary")
	conns := flag.Int("conns", 20000, "connections to attempt in all")
	perWorker := flag.Int("per-worker", 9000, "connections one worker process holds (under its descriptor limit)")
	mode := flag.String("mode", "keepalive", "keepalive: one request, then idle; silent: connect and send nothing")
	hold := flag.Duration("hold", 20*time.Second, "how long the connections stay after the last is opened")
	sources := flag.Int("sources", 1, "loopback addresses the flood comes from (127.0.1.1 on)")
	probeFrom := flag.String("probe-from", "127.0.0.2", "the probe's source address (a kubelet's is not the attacker's)")
	worker := flag.String("worker", "", "internal: be a worker that floods this address")
	first := flag.Int("first", 0, "internal: the worker's first connection, for its source address")
	flag.Parse()
	if *worker != "" {
		runWorker(*worker, *first, *perWorker, *sources, *mode, *hold)
		return
	}
	if err := run(*bin, *conns, *perWorker, *sources, *probeFrom, *mode, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "metricsflood:", err)
		os.Exit(1)
	}
}

const manifest = `apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: target}
spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: ["127.0.0.1:%d"]}
`

// report is what a worker prints when its connections have been held.
type report struct {
	Attempted, Answered, Failed, OpenAtEnd int
}

func run(bin string, conns, perWorker, sources int, probeFrom, mode string, hold time.Duration) error {
	dir, err := os.MkdirTemp("", "metricsflood")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	relayPort, metricsPort := freePort(), freePort()
	if err := os.WriteFile(filepath.Join(dir, "relay.yaml"), fmt.Appendf(nil, manifest, relayPort, relayPort), 0o644); err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(metricsPort))
	relay := exec.Command(bin, "local", "-f", dir, "--metrics-addr", addr, "--log-level", "error")
	relay.Stderr = os.Stderr
	if err := relay.Start(); err != nil {
		return err
	}
	defer func() {
		relay.Process.Signal(syscall.SIGTERM)
		relay.Wait()
	}()
	if err := waitReady(addr, 30*time.Second); err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // let start-up garbage be collected
	idle, err := rss(relay.Process.Pid)
	if err != nil {
		return err
	}

	// Sample memory and probe while the flood runs.
	stop := make(chan struct{})
	var peak atomic.Int64
	peak.Store(idle)
	var probes, probeFails atomic.Int64
	var slowest atomic.Int64
	var bg sync.WaitGroup
	bg.Add(2)
	go func() {
		defer bg.Done()
		for t := time.NewTicker(500 * time.Millisecond); ; {
			select {
			case <-stop:
				return
			case <-t.C:
				if r, err := rss(relay.Process.Pid); err == nil && r > peak.Load() {
					peak.Store(r)
				}
			}
		}
	}()
	go func() {
		defer bg.Done()
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(probeFrom)}}
		c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.DialContext}}
		for t := time.NewTicker(time.Second); ; {
			select {
			case <-stop:
				return
			case <-t.C:
				start := time.Now()
				resp, err := c.Get("http://" + addr + "/healthz")
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				probes.Add(1)
				if err != nil || resp.StatusCode != http.StatusOK {
					probeFails.Add(1)
				}
				if d := time.Since(start); int64(d) > slowest.Load() {
					slowest.Store(int64(d))
				}
			}
		}
	}()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	var workers []*exec.Cmd
	var outs []io.Reader
	for first := 0; first < conns; first += perWorker {
		n := min(conns-first, perWorker)
		w := exec.Command(self, "-worker", addr, "-first", strconv.Itoa(first), "-per-worker", strconv.Itoa(n),
			"-sources", strconv.Itoa(sources), "-mode", mode, "-hold", hold.String())
		w.Stderr = os.Stderr
		out, err := w.StdoutPipe()
		if err != nil {
			return err
		}
		if err := w.Start(); err != nil {
			return err
		}
		workers, outs = append(workers, w), append(outs, out)
	}
	var total report
	for i, w := range workers {
		var r report
		if err := json.NewDecoder(outs[i]).Decode(&r); err != nil {
			return fmt.Errorf("worker %d: %w", i, err)
		}
		w.Wait()
		total.Attempted += r.Attempted
		total.Answered += r.Answered
		total.Failed += r.Failed
		total.OpenAtEnd += r.OpenAtEnd
	}
	end, _ := rss(relay.Process.Pid)
	close(stop)
	bg.Wait()

	mib := func(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
	fmt.Printf("mode %s, from %d source(s): %d connections attempted (%d answered, %d failed to connect or were cut before an answer)\n",
		mode, sources, total.Attempted, total.Answered, total.Failed)
	fmt.Printf("relay RSS: idle %s, peak %s (+%s), with the flood's connections held %s\n", mib(idle), mib(peak.Load()), mib(peak.Load()-idle), mib(end))
	fmt.Printf("connections still open after %s: %d\n", hold, total.OpenAtEnd)
	fmt.Printf("probes from %s during the flood: %d, failed %d, slowest %s\n", probeFrom, probes.Load(), probeFails.Load(), time.Duration(slowest.Load()).Round(time.Millisecond))
	return nil
}

// runWorker opens n connections to addr, the i-th of all from the
// (i mod sources)-th source, holds them for hold after the last, then
// prints a report of them as JSON.
func runWorker(addr string, first, n, sources int, mode string, hold time.Duration) {
	var mu sync.Mutex
	var conns []net.Conn
	var r report
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		k := (first + i) % sources
		from := net.IPv4(127, 0, byte(1+k/250), byte(1+k%250))
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, ok := open(from, addr, mode)
			mu.Lock()
			defer mu.Unlock()
			r.Attempted++
			if !ok {
				r.Failed++
				if c != nil {
					c.Close()
				}
				return
			}
			r.Answered++
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	time.Sleep(hold)
	for _, c := range conns {
		if stillOpen(c) {
			r.OpenAtEnd++
		}
		c.Close()
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

// open connects and, in keepalive mode, reads one answer: the connection
// is then an idle keep-alive one. In silent mode connecting is enough.
func open(from net.IP, addr, mode string) (net.Conn, bool) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: from}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, false
	}
	if mode == "silent" {
		return c, true
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n"); err != nil {
		return c, false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c, true
}

// stillOpen says whether the server has not closed c: a read that times
// out found nothing, neither data nor an end.
func stillOpen(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(time.Millisecond))
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func waitReady(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the relay's %s/readyz did not answer ok within %s", addr, within)
}

// rss is a process's resident memory in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// freePort picks below the ephemeral range, where no outgoing connection
// takes the port before a relay listens on it.
func freePort() int {
	p, err := freeport.Pick()
	if err != nil {
		panic(err)
	}
	return p
}
