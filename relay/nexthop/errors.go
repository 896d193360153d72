package nexthop

import (
	"errors"
	"fmt"
)

// ErrDraining is a next hop that drains: it takes no new flows.
var ErrDraining = errors.New("the relay is draining (shutting down): it takes no new flows")

// NextHop is the reason of every Error, the reason label of
// hoplink_flow_errors_total.
const NextHop = "next_hop"

// Error is a flow that could not reach its next hop.
type Error struct {
	Reason string
	// Next is the relay that could not be reached, when one was chosen.
	Next string
	Err  error
}

func (e *Error) Error() string {
	if e.Next != "" {
		return fmt.Sprintf("next hop %s: %v", e.Next, e.Err)
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

func unknown(next string) error {
	return &Error{Reason: NextHop, Next: next, Err: fmt.Errorf("%q is not a known relay", next)}
}
