package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoplink/hoplink/internal/testing/procs"
	"github.com/hoplink/hoplink/internal/testing/readme"
	"github.com/hoplink/hoplink/internal/testing/testutil"
	"github.com/hoplink/hoplink/manifest"
	"github.com/hoplink/hoplink/relay/local"
	"github.com/hoplink/hoplink/route"
)

const readmePath = "../../README.md"

// demoMetrics is the README's grep of the demo's metrics.
var demoMetrics = regexp.MustCompile(`^hoplink_(chain_route_info|link_rtt_seconds|chain_latency_seconds|link_transport_info)`)

// The README's demo is what `make demo` prints, run here as make runs it
// (bin/hoplink local -f examples/local --metrics-addr 127.0.0.1:9464, from
// the repository's root, on the example's own ports): its log up to the
// first route, the metrics a curl through the routed chain reads, and the
// status and probe commands the demo logs. Times, ports the kernel picks
// and measured figures differ from run to run and are left out of the
// comparison; everything else must match. The route the README promises
// comes from the emulated round trips through the route package, so a
// change of the example's annotations that changes the route fails here
// too. HOPLINK_UPDATE_DOCS=1 rewrites the samples from this run.
func TestReadmeDemo(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	set, err := manifest.Load(filepath.Join(root, "examples", "local"))
	if err != nil {
		t.Fatal(err)
	}
	want, sentence := expectedDemoRoute(t, set)
	if doc, err := os.ReadFile(readmePath); err != nil || !strings.Contains(string(doc), sentence) {
		t.Errorf("README.md does not say, from the emulated round trips of examples/local:\n%s\n(read: %v)", sentence, err)
	}

	bin := procs.Hoplink(t)
	cmd := exec.Command(bin, "local", "-f", "examples/local", "--metrics-addr", "127.0.0.1:9464")
	cmd.Args[0], cmd.Dir = "bin/hoplink", root // as make demo runs it
	var stderr testutil.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
	}()

	// Up: the status command logged, the routed chain's first route
	// taken, every link connected.
	var command string
	firstRoute := regexp.MustCompile(`msg="route changed" relay=hk chain=default/fastest from="" to=(\S+) .*reason="first route"`)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		log := stderr.String()
		m := inspectLine.FindStringSubmatch(log)
		if m != nil && firstRoute.MatchString(log) && strings.Count(log, `msg="peer connected"`) >= 3 {
			command, _ = strconv.Unquote(m[1])
			break
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("make demo's command ended (%v); are the example's ports (7401-7403, 9464, 15200-15202, 15353) taken?\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo did not come up in 60 s:\n%s", log)
		}
	}
	// On an idle host the first route is the cheapest; on a busy one the
	// first round's figures carry the host's own delays, may price the
	// links wrong, and the chain moves to the cheapest two rounds later.
	// Either way it ends there, which the wait below checks, and the log
	// says why it moved.
	if got := firstRoute.FindStringSubmatch(stderr.String())[1]; got != strings.Join(want, ",") {
		t.Logf("the demo's routed chain took %s first, not %s (a busy host?)", got, strings.Join(want, ","))
	}
	words := strings.Fields(command)
	if len(words) < 2 || words[0] != "bin/hoplink" || words[1] != "status" {
		t.Fatalf("logged command %q, want bin/hoplink status ...", command)
	}
	hoplink := func(args ...string) string {
		t.Helper()
		c := exec.Command(bin, args...)
		c.Dir = root
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("hoplink %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	hoplink(append(words[1:], "--wait", "--wait-timeout", "30s")...)

	// A second terminal: curl through the routed chain.
	// The relays after the entry learn the routed chain's route within a
	// few rounds; the README shows the metrics once they have (a user
	// curls seconds later, not at once). Read at the metrics port itself,
	// which starts no flow.
	web := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := web.Get("http://127.0.0.1:9464/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		settled := regexp.MustCompile(`(?m)^hoplink_chain_route_info\{chain="default/fastest",relay="[a-z]+",route="` + strings.Join(want, ",") + `"\} 1$`)
		if len(settled.FindAllString(string(b), -1)) == len(set.Relays) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s on, not every relay has fastest on %s:\n%s\n%s", strings.Join(want, ","), b, stderr.String())
		}
	}
	demoLog := stderr.String()
	// One request per connection, as curl: a connection kept open would be
	// an open flow that the drain at Ctrl-C waits for.
	resp, err := web.Get("http://127.0.0.1:15201/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var metrics strings.Builder
	metrics.WriteString("$ curl -s 127.0.0.1:15201/metrics | grep -E '^hoplink_(chain_route_info|link_rtt_seconds|chain_latency_seconds|link_transport_info)'\n")
	for line := range strings.SplitSeq(string(body), "\n") {
		if demoMetrics.MatchString(line) {
			metrics.WriteString(line + "\n")
		}
	}
	// The measured links are the emulated ones, not the loopback.
	links, _ := local.EmulatedLinks(set)
	for _, l := range links {
		for _, dir := range [][2]string{{l.A, l.B}, {l.B, l.A}} {
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^hoplink_link_rtt_seconds\{from="%s",to="%s"\} (\S+)$`, dir[0], dir[1]))
			if m := re.FindStringSubmatch(metrics.String()); m != nil {
				if v, _ := strconv.ParseFloat(m[1], 64); v < l.RTT.Seconds() {
					t.Errorf("link %s -> %s measured %gs, less than its emulated %v", dir[0], dir[1], v, l.RTT)
				}
			}
		}
	}

	status := "$ " + command + "\n" + hoplink(words[1:]...)
	probe := "$ " + strings.Replace(command, " status ", " probe fastest ", 1) + "\n" +
		hoplink(append([]string{"probe", "fastest"}, words[2:]...)...)

	// Ctrl-C: it drains and stops, and removes the observer's directory.
	cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Errorf("after Ctrl-C: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30 s after Ctrl-C:\n%s", stderr.String())
	}
	if _, err := os.Stat(words[len(words)-1]); !os.IsNotExist(err) {
		t.Errorf("the observer's directory %s outlived the demo (%v)", words[len(words)-1], err)
	}

	for _, s := range []struct{ name, got string }{
		{"demo-log", demoLogSample(demoLog)},
		{"demo-metrics", metrics.String()},
		{"demo-status", status},
		{"demo-probe", probe},
	} {
		if err := checkSample(readmePath, s.name, s.got); err != nil {
			t.Error(err)
		}
	}
}

// expectedDemoRoute is the route of the demo's routed chain that its
// emulated round trips make cheapest, by the route package the route
// controller uses, and the README's sentence that says so.
func expectedDemoRoute(t *testing.T, set *manifest.Set) ([]string, string) {
	t.Helper()
	links, err := local.EmulatedLinks(set)
	if err != nil {
		t.Fatal(err)
	}
	var g route.Graph
	rtt := map[[2]string]time.Duration{}
	for _, l := range links {
		g.SetLink(l.A, l.B, l.RTT)
		g.SetLink(l.B, l.A, l.RTT)
		rtt[[2]string{l.A, l.B}], rtt[[2]string{l.B, l.A}] = l.RTT, l.RTT
	}
	ch := set.Chain(manifest.Key("default", "fastest"))
	if ch == nil || !ch.Spec.Mode.Routed() {
		t.Fatal("examples/local has no routed Chain fastest")
	}
	paths := route.Candidates(&g, route.Request{Entry: ch.Spec.Entry, Exit: ch.Spec.Exit, Via: ch.Spec.Via, MaxHops: int(ch.Spec.MaxHops)}, 8)
	if len(paths) < 2 {
		t.Fatalf("candidates %v: the demo wants a choice", paths)
	}
	var sums, others []string
	for i := 1; i < len(paths[0].Relays); i++ {
		sums = append(sums, rtt[[2]string{paths[0].Relays[i-1], paths[0].Relays[i]}].String())
	}
	for _, p := range paths[1:] {
		others = append(others, fmt.Sprintf("%v for %s", p.Cost, strings.Join(p.Relays, " -> ")))
	}
	head := fmt.Sprintf("`fastest` takes %s: %v", strings.Join(paths[0].Relays, " -> "), paths[0].Cost)
	if len(sums) > 1 {
		head = fmt.Sprintf("`fastest` takes %s: %s = %v", strings.Join(paths[0].Relays, " -> "), strings.Join(sums, " + "), paths[0].Cost)
	}
	return paths[0].Relays, head + " of emulated round trips, against " + strings.Join(others, ", ") + "."
}

// demoLogSample is the demo's log as the README shows it: without the
// times, up to where a user would curl.
func demoLogSample(log string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(log, "\n") {
		if line == "" {
			continue
		}
		b.WriteString(timePrefix.ReplaceAllString(line, "") + "\n")
	}
	return b.String()
}

var timePrefix = regexp.MustCompile(`^time=\S+ `)

// Values that differ from run to run or from host to host, by where they
// are: log keys, metric values, table columns.
var (
	variableKeys = regexp.MustCompile(`\b(remote|estimated|measured|algorithm)=\S+`)
	routeChange  = regexp.MustCompile(`\b(from|to|reason)=("[^"]*"|\S+)`)
	observerDir  = regexp.MustCompile(`/tmp/hoplink-local-[0-9]+`)
	metricValue  = regexp.MustCompile(`^(hoplink_(?:link_rtt_seconds|chain_latency_seconds)\{[^}]*\}) \S+$`)
	variableCols = map[string]bool{"VERSION": true, "CERT EXPIRES": true, "RTT": true, "JITTER": true, "LOSS": true, "TCP CC": true,
		"CHANGED": true, "REASON": true, "COST": true, "ESTIMATED": true, "MEASURED": true, "CONNECT": true, "ROUND TRIP": true}
)

// normalize blanks what varies in a sample. Log lines are sorted: the
// relays log concurrently, so lines of one moment come in any order.
func normalize(sample string) string {
	var out []string
	var header []string
	isLog := false
	for line := range strings.SplitSeq(observerDir.ReplaceAllString(sample, "/tmp/hoplink-local-N"), "\n") {
		switch {
		case strings.HasPrefix(line, "level=") && strings.Contains(line, `msg="route changed"`):
			// One line or two (a busy host's first round may move it):
			// the words, not the routes, which are checked apart.
			line = routeChange.ReplaceAllString(variableKeys.ReplaceAllString(line, "$1=*"), "$1=*")
			if slices.Contains(out, line) {
				continue
			}
			isLog = true
		case strings.HasPrefix(line, "level="):
			isLog = true
			line = variableKeys.ReplaceAllString(line, "$1=*")
			if strings.Contains(line, `msg="links' congestion control"`) {
				line = regexp.MustCompile(`\breason=\S+`).ReplaceAllString(line, "reason=*")
			}
		case metricValue.MatchString(line):
			line = metricValue.ReplaceAllString(line, "$1 *")
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "$ "):
			header = nil
		default:
			cells := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
			if header == nil {
				if len(cells) > 1 && strings.ToUpper(line) == line {
					header = cells
				}
				line = strings.Join(cells, " | ")
				break
			}
			for i := range cells {
				if i < len(header) && variableCols[header[i]] && cells[i] != "-" {
					cells[i] = "*"
				}
			}
			line = strings.Join(cells, " | ")
		}
		out = append(out, line)
	}
	if isLog {
		slices.Sort(out)
		return strings.Join(out, "\n")
	}
	// Rows of a table in any order: on a busy host the candidates' costs,
	// and so their order, change from round to round.
	var b strings.Builder
	for para := range strings.SplitSeq(strings.Join(out, "\n"), "\n\n") {
		rows := strings.Split(para, "\n")
		if len(rows) > 2 {
			slices.Sort(rows[1:])
		}
		b.WriteString(strings.Join(rows, "\n") + "\n\n")
	}
	return b.String()
}

// checkSample compares the README's sample with this run's, what varies
// aside, or rewrites it when HOPLINK_UPDATE_DOCS=1.
func checkSample(path, name, got string) error {
	if readme.Updating() {
		return readme.Replace(path, name, got)
	}
	in, err := readme.Block(path, name)
	if err != nil {
		return err
	}
	if normalize(in) != normalize(got) {
		return fmt.Errorf("%s: sample %q drifted from what the demo prints now.\n--- in the file:\n%s--- this run:\n%s(rewrite it with %s=1 and this test, then review the diff)", path, name, in, got, readme.UpdateEnv)
	}
	return nil
}
