// Command soak runs flows at a steady rate through four relay processes on
// loopback for a few minutes while the relays are operated on as people do:
// each middle relay of a routed chain and then its exit are restarted in
// turn (SIGTERM, so each drains; then started again), and the CA rotates in
// its three steps (a bundle, new certificates, the new CA alone; SIGHUP to
// every relay). It prints how many flows failed in each phase (the target
// is 0 but for new flows that find the exit down while it restarts) and
// each relay's goroutines, open file descriptors and resident memory at
// the start and at the end (no growth beyond noise), and writes the table
// into -out between soak markers.
//
//	make build && go run ./hack/bench/soak -hoplink bin/hoplink -out docs/benchmarks.md
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/testing/freeport"

	"github.com/hoplink/hoplink/internal/testing/testutil"
)

var relays = []string{"hk", "m1", "m2", "la"}

type soak struct {
	bin, dir, certs string
	ports           map[string]int
	metrics         map[string]int
	procs           map[string]*exec.Cmd
	mu              sync.Mutex
}

func main() {
	hoplink := flag.String("hoplink", "bin/hoplink", "the hoplink binary")
	duration := flag.Duration("duration", 3*time.Minute, "how long flows run (the operations are spread over it)")
	rate := flag.Int("rate", 50, "new flows a second")
	size := flag.Int("size", 16<<10, "bytes each flow sends and gets back")
	out := flag.String("out", "", "a Markdown file to write the table into, between <!-- soak:begin --> and <!-- soak:end -->")
	flag.Parse()
	if err := run(*hoplink, *duration, *rate, *size, *out); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(bin string, duration time.Duration, rate, size int, out string) error {
	bin, _ = filepath.Abs(bin)
	dir, err := os.MkdirTemp("", "hoplink-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s := &soak{bin: bin, dir: dir, certs: filepath.Join(dir, "certs"), ports: map[string]int{}, metrics: map[string]int{}, procs: map[string]*exec.Cmd{}}
	defer s.stopAll()
	// An interrupted run stops its relays too.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; s.stopAll(); os.Exit(1) }()

	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer echo.Close()
	go testutil.Serve(echo, testutil.Echo)
	tunnelPort := freePort()
	for i, r := range relays {
		s.ports[r] = freePort()
		s.metrics[r] = 19900 + i
	}
	var m strings.Builder
	for _, r := range relays {
		fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\nspec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n---\n", r, s.ports[r], s.ports[r])
	}
	m.WriteString("apiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: c}\nspec: {entry: hk, exit: la, via: [m1, m2], mode: sum, maxHops: 3, route: [hk, m1, la], probe: {interval: 500ms}}\n---\n")
	fmt.Fprintf(&m, "apiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: t}\nspec: {chain: c, listen: {address: 127.0.0.1, port: %d}, target: %q}\n", tunnelPort, echo.Addr().String())
	if err := os.WriteFile(filepath.Join(dir, "net.yaml"), []byte(m.String()), 0o644); err != nil {
		return err
	}
	if err := s.cmd("cert", "ca", "--certs", s.certs); err != nil {
		return err
	}
	if err := s.cmd(append([]string{"cert", "issue", "--certs", s.certs}, relays...)...); err != nil {
		return err
	}
	for _, r := range relays {
		if err := s.start(r); err != nil {
			return err
		}
	}
	addr := fmt.Sprintf("127.0.0.1:%d", tunnelPort)
	if err := waitFor(30*time.Second, func() error { return exchange(addr, 1000) }); err != nil {
		return fmt.Errorf("the chain never carried a flow: %w", err)
	}
	time.Sleep(2 * time.Second) // routes settle, links warm
	start := s.sample()

	// Flows at a steady rate, each counted in the phase it began in.
	var phase atomic.Value
	phase.Store("steady")
	var mu sync.Mutex
	ok, failed := map[string]int{}, map[string]int{}
	var firstErr = map[string]string{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			p := phase.Load().(string)
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := exchange(addr, size)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed[p]++
					if firstErr[p] == "" {
						firstErr[p] = err.Error()
					}
				} else {
					ok[p]++
				}
			}()
		}
	}()

	route := s.route()
	step := duration / 6
	phases := []string{"steady"}
	next := func(name string) { phase.Store(name); phases = append(phases, name) }
	time.Sleep(step)
	next("m1 restarted (drain)")
	if err := s.restart("m1"); err != nil {
		return err
	}
	time.Sleep(step)
	next("m2 restarted (drain)")
	if err := s.restart("m2"); err != nil {
		return err
	}
	time.Sleep(step)
	// The exit is every route's: its restart refuses new flows while it is
	// down (counted apart), and cuts none that were open.
	next("la (exit) restarted (drain)")
	if err := s.restart("la"); err != nil {
		return err
	}
	time.Sleep(step)
	next("CA rotated")
	if err := s.rotate(); err != nil {
		return err
	}
	time.Sleep(step)
	next("steady after")
	time.Sleep(step)
	close(stop)
	wg.Wait()
	time.Sleep(3 * time.Second) // flows and goroutines wind down
	end := s.sample()

	var b strings.Builder
	fmt.Fprintf(&b, "<!-- soak:begin -->\nMeasured %s on this machine by `go run ./hack/bench/soak` (%v, %d new flows a second, each %d KiB each way, through four relay processes: a sum chain from hk to la that may cross m1 or m2; its route at the start: %s).\n\n",
		time.Now().UTC().Format("2006-01-02"), duration, rate, size>>10, route)
	b.WriteString("| phase | flows | failed | first failure |\n|---|---|---|---|\n")
	total := 0
	for _, p := range phases {
		total += failed[p]
		fmt.Fprintf(&b, "| %s | %d | %d | %s |\n", p, ok[p]+failed[p], failed[p], strings.ReplaceAll(firstErr[p], "|", "/"))
	}
	b.WriteString("\n| relay | goroutines start / end | open fds start / end | RSS MiB start / end |\n|---|---|---|---|\n")
	for _, r := range relays {
		a, z := start[r], end[r]
		fmt.Fprintf(&b, "| %s | %.0f / %.0f | %.0f / %.0f | %.1f / %.1f |\n", r, a["go_goroutines"], z["go_goroutines"],
			a["process_open_fds"], z["process_open_fds"], a["process_resident_memory_bytes"]/(1<<20), z["process_resident_memory_bytes"]/(1<<20))
	}
	b.WriteString("\n(m1, m2 and la were restarted during the run: their start figures are of the first process, their end figures of the second.)\n<!-- soak:end -->\n")
	fmt.Print(b.String())
	fmt.Printf("failed flows: %d\n", total)
	if out != "" {
		doc, err := os.ReadFile(out)
		if err != nil {
			return err
		}
		re := regexp.MustCompile(`(?s)<!-- soak:begin -->.*?<!-- soak:end -->\n?`)
		if !re.Match(doc) {
			doc = append(doc, []byte("\n"+b.String())...)
		} else {
			doc = re.ReplaceAll(doc, []byte(b.String()))
		}
		if err := os.WriteFile(out, doc, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (s *soak) cmd(args ...string) error {
	out, err := exec.Command(s.bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("hoplink %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (s *soak) start(r string) error {
	logf, err := os.OpenFile(filepath.Join(s.dir, r+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	c := exec.Command(s.bin, "relay", "-f", filepath.Join(s.dir, "net.yaml"), "--name", r, "--certs", s.certs,
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", s.metrics[r]), "--drain-timeout", "20s")
	c.Stdout, c.Stderr = logf, logf
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.procs[r] = c
	s.mu.Unlock()
	return waitFor(10*time.Second, func() error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", s.metrics[r]))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s not ready", r)
		}
		return nil
	})
}

// restart stops a relay with SIGTERM (it drains: open flows finish, new
// ones go around it), waits for it to exit, and starts it again.
func (s *soak) restart(r string) error {
	s.mu.Lock()
	c := s.procs[r]
	s.mu.Unlock()
	c.Process.Signal(syscall.SIGTERM)
	c.Wait()
	return s.start(r)
}

// rotate takes the CA through its three steps, SIGHUP after each.
func (s *soak) rotate() error {
	next := filepath.Join(s.dir, "next")
	if err := s.cmd("cert", "ca", "--certs", next); err != nil {
		return err
	}
	if err := s.cmd(append([]string{"cert", "issue", "--certs", next}, relays...)...); err != nil {
		return err
	}
	read := func(p string) []byte { b, _ := os.ReadFile(p); return b }
	oldCA, newCA := read(filepath.Join(s.certs, "ca.crt")), read(filepath.Join(next, "ca.crt"))
	write := func(name string, b []byte) error { return os.WriteFile(filepath.Join(s.certs, name), b, 0o600) }
	steps := []func() error{
		func() error { return write("ca.crt", append(append([]byte{}, oldCA...), newCA...)) },
		func() error {
			for _, r := range relays {
				if err := write(r+".key", read(filepath.Join(next, r+".key"))); err != nil {
					return err
				}
				if err := write(r+".crt", read(filepath.Join(next, r+".crt"))); err != nil {
					return err
				}
			}
			return nil
		},
		func() error { return write("ca.crt", newCA) },
	}
	for _, st := range steps {
		if err := st(); err != nil {
			return err
		}
		s.mu.Lock()
		for _, c := range s.procs {
			c.Process.Signal(syscall.SIGHUP)
		}
		s.mu.Unlock()
		time.Sleep(2 * time.Second)
	}
	return nil
}

func (s *soak) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.procs {
		c.Process.Kill()
		c.Wait()
	}
	s.procs = map[string]*exec.Cmd{}
}

// route is the chain's route as hk exports it.
func (s *soak) route() string {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", s.metrics["hk"]))
	if err != nil {
		return "unknown"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if m := regexp.MustCompile(`hoplink_chain_route_info\{[^}]*route="([^"]+)"[^}]*\} 1`).FindSubmatch(b); m != nil {
		return strings.ReplaceAll(string(m[1]), ",", " -> ")
	}
	return "unknown"
}

// sample reads each relay's goroutines, descriptors and memory.
func (s *soak) sample() map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, r := range relays {
		out[r] = map[string]float64{}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", s.metrics[r]))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 2 && (f[0] == "go_goroutines" || f[0] == "process_open_fds" || f[0] == "process_resident_memory_bytes") {
				out[r][f[0]], _ = strconv.ParseFloat(f[1], 64)
			}
		}
		resp.Body.Close()
	}
	return out
}

// exchange sends size bytes through the Tunnel and checks the echo.
func exchange(addr string, size int) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	msg := bytes.Repeat([]byte("soak"), size/4+1)[:size]
	go c.Write(msg)
	got := make([]byte, size)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo corrupted")
	}
	return nil
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

func waitFor(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
