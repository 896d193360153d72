// Package systest holds the system tests: they run the hoplink binary as
// relay and operator processes (on loopback, in network namespaces of
// their own, against envtest API servers) and check from outside what the
// network does: failover, kills and drains, reloads and CA rotation,
// replicas, SNAT, congestion control, attacks, tun Tunnels, the seed 004
// scenario, the operator with its relays, two clusters and clustersets.
// The command line's own tests (help, flags, output formats) stay with
// its code in cmd/hoplink, and the relay's roles are tested in relay/.
// The package has no code but its tests.
package systest
