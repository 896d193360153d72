package systest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/testutil"
)

// replicaManifests: a chain from web to la, where la is a sidecar
// RelayNode with three replicas (as its Service's EndpointSlices would list
// them in a cluster). Each replica dials the target over its own loopback.
const replicaManifests = `
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: web}
spec: {listen: {port: 7401}}
---
apiVersion: hoplink.dev/v1alpha1
kind: RelayNode
metadata: {name: la}
spec: {listen: {port: 7401}, sidecar: {}, endpoints: ["10.231.41.2:7401", "10.231.42.2:7401", "10.231.43.2:7401"]}
---
apiVersion: hoplink.dev/v1alpha1
kind: Chain
metadata: {name: east}
spec: {entry: web, exit: la, route: [web, la], transport: TRANSPORT}
---
apiVersion: hoplink.dev/v1alpha1
kind: Tunnel
metadata: {name: app}
spec: {chain: east, listen: {address: 127.0.0.1, port: 15400}, target: "127.0.0.1:5300"}
`

// replicaFlow is one open flow through the chain: the replica that
// answered, and the connection to keep talking on.
type replicaFlow struct {
	replica string
	c       net.Conn
	r       *bufio.Reader
}

// ping sends a line and expects it back: the flow still works.
func (f *replicaFlow) ping(msg string) error {
	f.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintln(f.c, msg); err != nil {
		return err
	}
	got, err := f.r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != msg {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// TestSidecarReplicas: one predecessor relay and three exit replicas of one
// name, each in its own namespace. New flows spread over the replicas;
// killing one resets only the flows it carried, and new flows go to the
// others.
func TestSidecarReplicas(t *testing.T) {
	requireNetns(t)
	bin := procs.Hoplink(t)
	for _, transport := range []string{"quic", "tls"} {
		t.Run(transport, func(t *testing.T) { sidecarReplicas(t, bin, transport) })
	}
}

func sidecarReplicas(t *testing.T, bin, transport string) {
	dir := t.TempDir()
	if d := os.Getenv("HOPLINK_TEST_KEEP"); d != "" {
		dir = d
	}
	certs := procs.RelayFiles(t, bin, dir, "hoplink.yaml", strings.Replace(replicaManifests, "TRANSPORT", transport, 1), "web", "la")

	pred := newNetns(t, "hlrep-web")
	replicas := map[string]*replicaProc{}
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("r%d", i)
		ns := newNetns(t, "hlrep-"+name)
		if a, b := link(t, pred, ns, 40+i, fmt.Sprintf("hlw%d", i), "eth0"); a == "" || b == "" {
			t.Fatal("no addresses")
		}
		// The target, on the replica's loopback: it names the replica, then echoes.
		ns.serve("127.0.0.1:5300", func(c *net.TCPConn) {
			fmt.Fprintln(c, name)
			io.Copy(c, c)
		})
		cmd := ns.start(filepath.Join(dir, name+".log"), bin, "relay", "-f", dir, "--name", "la", "--certs", certs)
		replicas[name] = &replicaProc{cmd: cmd}
	}
	pred.start(filepath.Join(dir, "web.log"), bin, "relay", "-f", dir, "--name", "web", "--certs", certs)

	dial := func() (*replicaFlow, error) {
		var c net.Conn
		var err error
		pred.do(func() { c, err = net.DialTimeout("tcp", "127.0.0.1:15400", 5*time.Second) })
		if err != nil {
			return nil, err
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(c)
		name, err := r.ReadString('\n')
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("no answer: %w", err)
		}
		f := &replicaFlow{replica: strings.TrimSpace(name), c: c, r: r}
		t.Cleanup(func() { c.Close() })
		return f, f.ping("hello")
	}
	testutil.WaitFor(t, "a flow through the chain", func() error {
		f, err := dial()
		if f != nil {
			f.c.Close()
		}
		return err
	})

	// Twelve flows, held open.
	var flows []*replicaFlow
	count := map[string]int{}
	for i := 0; i < 12; i++ {
		f, err := dial()
		if err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
		flows = append(flows, f)
		count[f.replica]++
	}
	if len(count) < 2 {
		t.Fatalf("12 flows all went to %v: not spread over the replicas", count)
	}
	t.Logf("12 flows spread as %v", count)

	// Kill the replica that carries the most.
	victim := ""
	for r, n := range count {
		if victim == "" || n > count[victim] {
			victim = r
		}
	}
	replicas[victim].cmd.Process.Signal(syscall.SIGKILL)
	procs.Wait(replicas[victim].cmd)
	start := time.Now()

	// Its flows end (QUIC notices the dead peer within its idle timeout);
	// every other flow keeps working meanwhile.
	for _, f := range flows {
		if f.replica != victim {
			continue
		}
		if err := f.ping("after"); err == nil {
			t.Errorf("a flow of the killed replica %s still answers", victim)
		}
	}
	t.Logf("the killed replica's flows ended after %v", time.Since(start).Round(100*time.Millisecond))
	for i, f := range flows {
		if f.replica == victim {
			continue
		}
		if err := f.ping(fmt.Sprint("still ", i)); err != nil {
			t.Errorf("flow %d on %s, a live replica, broke: %v", i, f.replica, err)
		}
	}

	// New flows go to the live replicas, every one.
	for i := 0; i < 9; i++ {
		f, err := dial()
		if err != nil {
			t.Fatalf("new flow %d after the kill: %v", i, err)
		}
		if f.replica == victim {
			t.Fatalf("new flow %d went to the killed replica", i)
		}
		f.c.Close()
	}
}

type replicaProc struct{ cmd *exec.Cmd }
