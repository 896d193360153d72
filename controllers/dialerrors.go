package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/hoplink/hoplink/adminapi"
)

// reachError is what the operator says, in conditions and Events, of a
// relay endpoint it could not ask. The endpoints are the RelayNode's
// writers' to choose (spec.endpoints), and the operator dials them from
// inside the cluster: the raw error would tell them what answers there
// (a certificate's names, a service that speaks no TLS, a port that
// refuses) and so map the operator's network for them. So it says only
// which of a few things happened; a refusal by a relay itself (its
// admin API's own answer) is kept. The full error goes to the operator's
// log alone, where only its admins read it.
func reachError(endpoint string, err error) error {
	var refusal *adminapi.Error
	var ne net.Error
	var what string
	switch {
	case errors.As(err, &refusal):
		return fmt.Errorf("%s: %w", endpoint, refusal)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		what = "did not answer in time"
	case errors.Is(err, syscall.ECONNREFUSED):
		what = "refused the connection"
	default:
		what = "could not be asked (no hoplink relay of this cluster's CA answered there)"
	}
	return fmt.Errorf("%s %s", endpoint, what)
}
