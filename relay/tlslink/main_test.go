package tlslink

import (
	"os"
	"testing"

	"github.com/hoplink/hoplink/relay/flow"
)

// Flows joined here run on event loops (loop_test.go), as a relay's do
// with --flow-loops.
func TestMain(m *testing.M) {
	flow.SetLoops(2)
	os.Exit(m.Run())
}
