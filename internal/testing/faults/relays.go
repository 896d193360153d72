package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hoplink/hoplink/internal/testing/freeport"
)

// Run starts a relay set of its own in a new directory under dir, waits
// until the Case's chain carries a flow, runs the Case with bin's relays
// and stops them. An error is a measurement that could not be made; a
// Result with a bad Verdict is a measurement.
func Run(ctx context.Context, bin, dir string, c Case) (Result, error) {
	res := Result{Case: c}
	if err := c.check(); err != nil {
		return res, err
	}
	t, err := listenTargets()
	if err != nil {
		return res, err
	}
	defer t.close()
	var rs *relays
	// Another process may take a port between our choosing it and the
	// relay's binding it: a relay that exits at start gets fresh ports.
	for attempt := 1; ; attempt++ {
		rs, err = startRelays(ctx, bin, dir, t.addr())
		if err == nil {
			err = rs.ready(ctx, t, c.Transport)
		}
		if err == nil {
			break
		}
		if rs != nil {
			rs.stop()
			res.Dir = rs.dir
		}
		if attempt == 3 || !errors.Is(err, errExited) || ctx.Err() != nil {
			return res, err
		}
	}
	defer rs.stop()
	res, err = transfer(ctx, t, rs.dialer(c.Transport), c, func() error { return rs.kill(relayOf[c.Role]) })
	res.Dir = rs.dir
	return res, err
}

var errExited = errors.New("a relay exited")

// relays is hk, m and la, each a `hoplink relay` process, with a static
// Chain and a TCP Tunnel per transport.
type relays struct {
	dir     string
	procs   map[string]*proc
	tunnels map[string]string // transport -> the Tunnel's listen address
}

type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process exited
}

// startRelays writes the manifests and certificates into a new directory
// under dir and starts the three relays.
func startRelays(ctx context.Context, bin, dir, target string) (*relays, error) {
	d, err := os.MkdirTemp(dir, "relays-")
	if err != nil {
		return nil, err
	}
	rs := &relays{dir: d, procs: map[string]*proc{}, tunnels: map[string]string{}}
	var b strings.Builder
	names := []string{"hk", "m", "la"}
	for _, r := range names {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "apiVersion: hoplink.dev/v1alpha1\nkind: RelayNode\nmetadata: {name: %s}\n"+
			"spec: {listen: {address: 127.0.0.1, port: %d}, endpoints: [\"127.0.0.1:%d\"]}\n---\n", r, port, port)
	}
	for _, tr := range Transports {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		rs.tunnels[tr] = fmt.Sprintf("127.0.0.1:%d", port)
		fmt.Fprintf(&b, "apiVersion: hoplink.dev/v1alpha1\nkind: Chain\nmetadata: {name: %s}\n"+
			"spec: {entry: hk, exit: la, via: [m], mode: static, route: [hk, m, la], transport: %s}\n---\n", tr, tr)
		fmt.Fprintf(&b, "apiVersion: hoplink.dev/v1alpha1\nkind: Tunnel\nmetadata: {name: %s}\n"+
			"spec: {chain: %s, listen: {address: 127.0.0.1, port: %d}, target: %q}\n---\n", tr, tr, port, target)
	}
	file := filepath.Join(d, "net.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	certs := filepath.Join(d, "certs")
	for _, args := range [][]string{{"cert", "ca", "--certs", certs}, append([]string{"cert", "issue", "--certs", certs}, names...)} {
		if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
		}
	}
	for _, r := range names {
		p, err := startRelay(ctx, bin, file, r, certs, filepath.Join(d, r+".log"))
		if err != nil {
			rs.stop()
			return nil, err
		}
		rs.procs[r] = p
	}
	return rs, nil
}

func startRelay(ctx context.Context, bin, file, name, certs, log string) (*proc, error) {
	out, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child has its own descriptor
	cmd := exec.CommandContext(ctx, bin, "relay", "-f", file, "--name", name, "--certs", certs)
	cmd.Stdout, cmd.Stderr = out, out
	// A relay outlives no measurement, even one whose process was killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// ready waits until the chain of transport carries a probe to the target.
func (rs *relays) ready(ctx context.Context, t *targets, transport string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		for name, p := range rs.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%w: %s at start:\n%s", errExited, name, tail(p.log, 20))
			default:
			}
		}
		err := t.probe(rs.dialer(transport))
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s chain carries no flow after 30 s: %v\nhk's log:\n%s", transport, err, tail(rs.procs["hk"].log, 20))
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (rs *relays) dialer(transport string) func() (net.Conn, error) {
	return func() (net.Conn, error) { return net.DialTimeout("tcp", rs.tunnels[transport], 3*time.Second) }
}

// kill ends relay name at once, as a crash would.
func (rs *relays) kill(name string) error {
	return rs.procs[name].cmd.Process.Signal(syscall.SIGKILL)
}

// stop kills every relay and waits for each to exit.
func (rs *relays) stop() {
	for _, p := range rs.procs {
		p.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, p := range rs.procs {
		<-p.done
	}
}

func tail(file string, lines int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}

// freePort finds a port free for both TCP and UDP (a relay listens on
// both with one number), never the same twice in a process: cases may run
// at once.
func freePort() (int, error) { return freeport.Pick() }
