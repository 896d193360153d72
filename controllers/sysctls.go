package controllers

import (
	corev1 "k8s.io/api/core/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/version"
)

// linkBufferSysctls raise, in a relay pod's own network namespace, how far
// the kernel's autotuning may grow a TCP socket's buffers. One TLS flow
// carries at most about half its send buffer per round trip, and the
// kernel's default ceiling (4 MiB to send, 6 MiB to receive) holds one flow
// to 56 Mbit/s at 300 ms; 16 MiB lets it fill 100 Mbit/s there. Autotuning
// still sizes each socket to its own round trip and rate, so short links
// keep small buffers. Both are namespaced, "safe" sysctls.
var linkBufferSysctls = []corev1.Sysctl{
	{Name: "net.ipv4.tcp_rmem", Value: "4096 131072 16777216"},
	{Name: "net.ipv4.tcp_wmem", Value: "4096 16384 16777216"},
}

// bufferSysctlsMinServer is the oldest API server whose every kubelet
// accepts linkBufferSysctls: kubelets accept them from 1.32 on, and may be
// three minor versions older than their API server.
var bufferSysctlsMinServer = utilversion.MustParseGeneric("1.35.0")

// BufferSysctlsAllowed says whether relay pods of a cluster whose API
// server reports v may carry linkBufferSysctls. A kubelet that does not
// accept a sysctl refuses the pod (SysctlForbidden), so when in doubt: no.
func BufferSysctlsAllowed(v *version.Info) bool {
	if v == nil {
		return false
	}
	got, err := utilversion.ParseGeneric(v.GitVersion)
	if err != nil {
		return false
	}
	return got.AtLeast(bufferSysctlsMinServer)
}
