package controllers

// Reasons of the conditions and Events the operator writes. Each has a
// section of docs/troubleshooting.md that says what it means and what to
// do; a test holds the two together.
const (
	// RelayNode Ready.
	ReasonRelaysReady            = "RelaysReady"
	ReasonRelaysNotReady         = "RelaysNotReady"
	ReasonNoNodes                = "NoNodes"
	ReasonExternal               = "External"
	ReasonNameConflict           = "NameConflict"
	ReasonImageNotAllowed        = "ImageNotAllowed"
	ReasonPrivilegesNotAllowed   = "PrivilegesNotAllowed"
	ReasonControlPlaneNotAllowed = "ControlPlaneNotAllowed"
	ReasonSidecarsReady          = "SidecarsReady"
	ReasonSidecarsNotReady       = "SidecarsNotReady"
	ReasonNoPods                 = "NoPods"
	ReasonNotInjected            = "NotInjected"
	// RelayNode RelaysHealthy.
	ReasonNoProblems    = "NoProblems"
	ReasonRelayProblems = "RelayProblems"
	// RelayNode CongestionControl.
	ReasonCongestionControlAsked   = "CongestionControlAsked"
	ReasonCongestionControlRefused = "CongestionControlRefused"
	// Chain Ready.
	ReasonRouteReady    = "RouteReady"
	ReasonRelayNotFound = "RelayNotFound"
	ReasonRelayNotReady = "RelayNotReady"
	ReasonNoRoute       = "NoRoute"
	// A routed Chain whose entry is another cluster's relay: routed there.
	ReasonEntryElsewhere = "EntryElsewhere"
	ReasonListFailed     = "ListFailed"
	// Tunnel Ready and Listening.
	ReasonReady           = "Ready"
	ReasonChainNotFound   = "ChainNotFound"
	ReasonChainNotReady   = "ChainNotReady"
	ReasonServiceConflict = "ServiceConflict"
	ReasonServiceFailed   = "ServiceFailed"
	ReasonLoopbackListen  = "LoopbackListen"
	ReasonTUNNotAllowed   = "TUNNotAllowed"
	ReasonListening       = "Listening"
	ReasonListenFailed    = "ListenFailed"
	// Tunnel Limited.
	ReasonWithinLimits     = "WithinLimits"
	ReasonFlowLimitReached = "FlowLimitReached"
	ReasonRateLimited      = "RateLimited"
	// Events of what relays report.
	ReasonTargetRefused    = "TargetRefused"
	ReasonHandshakeRefused = "HandshakeRefused"
	ReasonDeviceFailed     = "DeviceFailed"
	ReasonEgressRefused    = "EgressRefused"
	// PodCertificateRequest conditions (sidecar certificates).
	ReasonIssued           = "Issued"
	ReasonIssueFailed      = "IssueFailed"
	ReasonNotASidecarRelay = "NotASidecarRelay"
)
