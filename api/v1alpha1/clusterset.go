package v1alpha1

// Where an operator in multicluster mode stores its cluster's clusterset
// report (what it exports, for the other clusters of its set), in the relay
// namespace: relays there read this one ConfigMap and serve it to other
// clusters' operators over their admin API.
const (
	ClusterSetReportName = "hoplink-clusterset"
	// ClusterSetReportKey holds the report in the ConfigMap's binaryData,
	// gzipped JSON.
	ClusterSetReportKey = "report.json.gz"
)
