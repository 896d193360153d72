//go:build !linux

package flow

import (
	"net"
	"time"
)

// sinceReceived is 0 where the kernel does not say: an idle spliced flow is
// then never reset.
func sinceReceived(*net.TCPConn) time.Duration { return 0 }

// segments is zeros where the kernel does not say.
func segments(*net.TCPConn) (sent, retransmitted uint32) { return 0, 0 }

// wasReset is false where the kernel does not say: a reset then shows only
// to a read.
func wasReset(*net.TCPConn) bool { return false }

// inClose is false where the kernel does not say.
func inClose(*net.TCPConn) bool { return false }
