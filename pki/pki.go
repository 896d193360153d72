// Package pki makes and loads the certificates relays use to authenticate
// each other. A relay's identity is its RelayNode name, carried as the
// certificate's only DNS name; a relay accepts a peer only if the peer's
// certificate chains to the CA it was given.
package pki

import (
	"time"
)

// ALPN is the application protocol relays speak over QUIC and TLS.
const ALPN = "hoplink/1"

// AdminALPN is the protocol of a relay's admin API: HTTP on the relay's TLS
// port, for the operator's route controller alone.
const AdminALPN = "hoplink-admin/1"

// OperatorName is the name in the operator's client certificate. Relay
// names are DNS labels, without dots, so no relay can hold it.
const OperatorName = "operator.hoplink.dev"

// ObserverName is the name in the certificate `hoplink status` and
// `hoplink probe` present to relays' admin API: it may read a relay's
// status and measure chains, nothing else, and is never a relay's.
const ObserverName = "observer.hoplink.dev"

// ObserverValidity is how long an observer certificate holds.
const ObserverValidity = 90 * 24 * time.Hour

// AdminClient says whether name may call a relay's admin API.
func AdminClient(name string) bool { return name == OperatorName || name == ObserverName }
