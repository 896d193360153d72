package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// children finds the pid of this process's child named comm (envtest starts
// kube-apiserver and etcd as children); 0 if none.
func children(comm string) int {
	self := os.Getpid()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		stat, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < 0 || s[open+1:close] != comm {
			continue
		}
		f := strings.Fields(s[close+1:])
		if ppid, _ := strconv.Atoi(f[1]); ppid == self {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}

// cpuSeconds is a process's user and system CPU time.
func cpuSeconds(pid int) float64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	// After the comm: state is field 3, utime 14 and stime 15 (clock
	// ticks, 100 a second on Linux).
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

func cpuAll(procs map[string]int) map[string]float64 {
	out := map[string]float64{}
	for n, pid := range procs {
		out[n] = cpuSeconds(pid)
	}
	return out
}

// memory returns a process's resident and peak resident memory in MiB.
func memory(pid int) (rss, hwm float64) {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "VmRSS:":
				rss = kb / 1024
			case "VmHWM:":
				hwm = kb / 1024
			}
		}
	}
	return
}

var writeLine = regexp.MustCompile(`^rest_client_requests_total\{.*method="(POST|PUT|PATCH|DELETE)".*\} (\S+)$`)

// operatorWrites sums the operator's own count of write requests (client-go's
// rest_client_requests_total), so the load generator's writes are not in it.
func operatorWrites(addr string) (int, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	total := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := writeLine.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			total += int(v)
		}
	}
	return total, sc.Err()
}

var seriesLine = regexp.MustCompile(`^(\w+)\{(.*)\} (\S+)$`)

// breakdown reads the operator's counters: its writes by resource and verb
// (hoplink_operator_api_writes_total) and its reconciles by controller and
// result (controller_runtime_reconcile_total), keyed "resource verb" and
// "reconcile controller result".
func breakdown(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	label := func(labels, name string) string {
		m := regexp.MustCompile(name + `="([^"]*)"`).FindStringSubmatch(labels)
		if m == nil {
			return ""
		}
		return m[1]
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := seriesLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		switch m[1] {
		case "hoplink_operator_api_writes_total":
			out[label(m[2], "resource")+" "+label(m[2], "verb")] += v
		case "controller_runtime_reconcile_total":
			if v > 0 {
				out["reconcile "+label(m[2], "controller")+" "+label(m[2], "result")] += v
			}
		}
	}
	return out, sc.Err()
}

// diffLine is b-a, largest first, as "key n, key n", keys with prefix
// reconcile apart (reconciles: true) or only (false).
func diffLine(a, b map[string]float64, reconciles bool, per float64) string {
	type kv struct {
		k string
		v float64
	}
	var l []kv
	for k, v := range b {
		if strings.HasPrefix(k, "reconcile ") != reconciles {
			continue
		}
		if d := (v - a[k]) / per; d >= 0.05 {
			l = append(l, kv{strings.TrimPrefix(k, "reconcile "), d})
		}
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v })
	var parts []string
	for _, e := range l {
		parts = append(parts, fmt.Sprintf("%s %.0f", e.k, e.v))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

var apiWriteLine = regexp.MustCompile(`^apiserver_request_total\{.*verb="(POST|PUT|PATCH|DELETE|APPLY)".*\} (\S+)$`)

type writes struct{ total, leases int }

// apiWrites sums the API server's count of the write requests it served,
// from every client; leases apart.
func apiWrites(ctx context.Context, cfg *rest.Config) (writes, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return writes{}, err
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return writes{}, err
	}
	var w writes
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if m := apiWriteLine.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			w.total += int(v)
			if strings.Contains(sc.Text(), `resource="leases"`) {
				w.leases += int(v)
			}
		}
	}
	return w, sc.Err()
}

// replaceSection swaps the text between <!-- NAME:begin --> and <!-- NAME:end -->.
func replaceSection(file, name, section string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	s := string(data)
	b, e := strings.Index(s, "<!-- "+name+":begin -->"), strings.Index(s, "<!-- "+name+":end -->")
	if b < 0 || e < 0 {
		return fmt.Errorf("%s has no %s markers", file, name)
	}
	e += len("<!-- " + name + ":end -->\n")
	return os.WriteFile(file, []byte(s[:b]+section+s[e:]), 0o644)
}

// loadAverage is the host's 1, 5 and 15 minute load averages, "1.2, 3.4,
// 5.6": other jobs share these cores, and the times move with them.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) >= 3 {
		return f[0] + ", " + f[1] + ", " + f[2]
	}
	return "unknown"
}

// limiterWait reads how long the operator's requests waited for its own
// client-side rate limit (rest_client_rate_limiter_duration_seconds): the
// seconds in all, the requests, and those that waited over 25 ms.
func limiterWait(addr string) (seconds, requests, waited float64, err error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	const name = "rest_client_rate_limiter_duration_seconds"
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var fast float64
	for sc.Scan() {
		m := seriesLine.FindStringSubmatch(sc.Text())
		if m == nil || !strings.HasPrefix(m[1], name) {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		switch {
		case m[1] == name+"_sum":
			seconds += v
		case m[1] == name+"_count":
			requests += v
		case m[1] == name+"_bucket" && strings.Contains(m[2], `le="0.025"`):
			fast += v
		}
	}
	return seconds, requests, requests - fast, sc.Err()
}
