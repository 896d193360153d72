package nexthop

import (
	"os"
	"testing"

	"github.com/hoplink/hoplink/relay/flow"
)

// Flows joined here run on event loops, as a relay's do with --flow-loops
// (TestOpenTLSFlowsOnALoopShowWhatTheySent).
func TestMain(m *testing.M) {
	flow.SetLoops(2)
	os.Exit(m.Run())
}
