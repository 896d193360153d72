package main

import (
	"testing"

	"github.com/hoplink/hoplink/relay"
)

func TestMemoryLimitSizesTheRelay(t *testing.T) {
	for in, want := range map[string]int64{
		"max\n":                 0,
		"9223372036854771712\n": 0, // cgroup v1 without a limit
		"268435456\n":           256 << 20,
		"":                      0,
		"-1":                    0,
	} {
		if got := parseMemoryLimit(in); got != want {
			t.Errorf("parseMemoryLimit(%q) = %d, want %d", in, got, want)
		}
	}
	// The chart's 256 Mi relay limit: a relay that OOMed near 14,000 flows
	// now refuses new flows well before.
	if n := flowsFor(256 << 20); n < 4000 || n > 8000 {
		t.Errorf("256 MiB affords %d flows", n)
	}
	if n := flowsFor(64 << 30); n != relay.DefaultMaxFlows {
		t.Errorf("64 GiB affords %d flows, want the default %d", n, relay.DefaultMaxFlows)
	}
	if n := flowsFor(32 << 20); n != 256 {
		t.Errorf("32 MiB affords %d flows, want the floor 256", n)
	}
}
