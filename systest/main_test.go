package systest

import (
	"os"
	"testing"

	"github.com/hoplink/hoplink/internal/testing/procs"
)

// Every test here runs the binary: they share one build of it.
func TestMain(m *testing.M) { os.Exit(procs.Main(m)) }
