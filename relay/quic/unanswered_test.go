package quic

import (
	"context"
	"errors"
	"fmt"
	"testing"

	quicgo "github.com/quic-go/quic-go"
)

// TestUnanswered: a handshake nothing answered reads the same whichever
// of the dial's deadline and QUIC's idle timeout ended it (the log and the
// troubleshooting page quote it); other errors pass as they are.
func TestUnanswered(t *testing.T) {
	for _, err := range []error{context.DeadlineExceeded, &quicgo.IdleTimeoutError{}, &quicgo.HandshakeTimeoutError{}, fmt.Errorf("dial: %w", context.DeadlineExceeded)} {
		if got := unanswered(err); got != errUnanswered {
			t.Errorf("%v: %v", err, got)
		}
	}
	other := errors.New("CRYPTO_ERROR 0x12a (remote): tls: bad certificate")
	if got := unanswered(other); got != other {
		t.Errorf("%v became %v", other, got)
	}
	if errUnanswered.Error() != "no answer to the QUIC handshake within 5s" {
		t.Errorf("the message the troubleshooting page quotes changed: %q", errUnanswered)
	}
}
