package flow

import (
	"os"
	"testing"
)

// The package's joins run on event loops where both ends are sockets
// (as a relay's do, --flow-loops), and on goroutines where a
// test calls joinHalves.
func TestMain(m *testing.M) {
	SetLoops(2)
	os.Exit(m.Run())
}
