package main

import (
	"os"
	"testing"

	"github.com/hoplink/hoplink/internal/testing/procs"
)

// The tests that run relays share one build of the binary.
func TestMain(m *testing.M) { os.Exit(procs.Main(m)) }
