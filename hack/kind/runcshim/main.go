// Command runcshim stands in for runc where the machine's capability
// bounding set lacks CAP_SYS_RESOURCE (as on the VMs hoplink's e2e runs on):
// before runc creates a container, it takes CAP_SYS_RESOURCE out of the
// container's capabilities and drops its oom_score_adj, both of which runc
// would fail to apply ("unable to apply caps: operation not permitted").
// Everything else goes to the real runc unchanged.
//
// Installed as a Docker runtime on the host, and as containerd's runc
// (BinaryName) inside kind's node image.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// realRunc is where the real binary lives; overridable for a test.
var realRunc = "/usr/sbin/runc"

func main() {
	if p := os.Getenv("RUNCSHIM_RUNC"); p != "" {
		realRunc = p
	}
	var err error
	if bundle := bundleOf(os.Args[1:]); bundle != "" {
		err = fix(filepath.Join(bundle, "config.json"), true)
	} else if proc := processOf(os.Args[1:]); proc != "" {
		err = fix(proc, false)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "runcshim: %v\n", err)
		os.Exit(1)
	}
	args := append([]string{realRunc}, os.Args[1:]...)
	if err := syscall.Exec(realRunc, args, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "runcshim: exec %s: %v\n", realRunc, err)
		os.Exit(1)
	}
}

// bundleOf returns the bundle directory of a create or run command.
func bundleOf(args []string) string {
	cmd := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case cmd == "" && (a == "create" || a == "run"):
			cmd = a
		case cmd != "" && (a == "--bundle" || a == "-b") && i+1 < len(args):
			return args[i+1]
		case cmd != "" && len(a) > 9 && a[:9] == "--bundle=":
			return a[9:]
		}
	}
	if cmd != "" {
		return "." // runc's default: the working directory
	}
	return ""
}

// processOf returns the process file of an exec command (docker exec and
// kubectl exec pass the new process's spec so), which asks for the same
// capabilities.
func processOf(args []string) string {
	exec := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case !exec && a == "exec":
			exec = true
		case exec && (a == "--process" || a == "-p") && i+1 < len(args):
			return args[i+1]
		case exec && len(a) > 10 && a[:10] == "--process=":
			return a[10:]
		}
	}
	return ""
}

// fix edits a container's config.json (bundle) or an exec's process.json.
func fix(path string, bundle bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	proc := spec
	if bundle {
		proc, _ = spec["process"].(map[string]any)
	}
	if proc == nil {
		return nil
	}
	delete(proc, "oomScoreAdj")
	if caps, _ := proc["capabilities"].(map[string]any); caps != nil {
		for set, v := range caps {
			list, _ := v.([]any)
			caps[set] = slices.DeleteFunc(list, func(c any) bool { return c == "CAP_SYS_RESOURCE" })
		}
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}
