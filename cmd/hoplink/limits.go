package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/hoplink/hoplink/relay"
)

// A relay in a container with a memory limit sizes itself to it: past the
// limit the kernel kills the process, and with it every flow, where a full
// relay refuses new flows alone. perFlowBudget is what one open flow may
// cost (measured 10-14 KiB at 10,000 flows, docs/benchmarks.md) with room
// for buffers in use; baseBudget what the process needs with none.
const (
	perFlowBudget = 24 << 10
	baseBudget    = 48 << 20
	// memoryShare of the limit is what the Go runtime aims to stay under.
	memoryShare = 0.8
)

// cgroupFiles hold the memory limit: cgroup v2, then v1.
var cgroupFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// memoryLimit is the container's memory limit in bytes, or 0 when none is
// set.
func memoryLimit() int64 {
	for _, f := range cgroupFiles {
		if b, err := os.ReadFile(f); err == nil {
			return parseMemoryLimit(string(b))
		}
	}
	return 0
}

// parseMemoryLimit reads a cgroup memory limit: "max" (v2) or a value near
// the largest int64 (v1) mean none.
func parseMemoryLimit(s string) int64 {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= 1<<60 {
		return 0
	}
	return n
}

// flowsFor is the --max-flows a memory limit affords.
func flowsFor(limit int64) int {
	n := (int64(float64(limit)*memoryShare) - baseBudget) / perFlowBudget
	return int(min(max(n, 256), relay.DefaultMaxFlows))
}

// sizeToContainer sets GOMEMLIMIT (unless the environment does) and, unless
// the flag was given, the flow limit, from the container's memory limit.
func sizeToContainer(log *slog.Logger, maxFlows *int, flagSet bool) {
	limit := memoryLimit()
	if limit == 0 {
		return
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(int64(float64(limit) * memoryShare))
	}
	if !flagSet {
		*maxFlows = flowsFor(limit)
	}
	log.Info("sized to the container's memory limit", "limit", fmt.Sprintf("%d MiB", limit>>20),
		"max_flows", *maxFlows, "gomemlimit", fmt.Sprintf("%d MiB", debug.SetMemoryLimit(-1)>>20))
}
