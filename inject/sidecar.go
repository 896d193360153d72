// Package inject adds a sidecar relay to the pods of a sidecar RelayNode:
// the container and the JSON patch that adds it (pure), the mutating
// admission webhook that applies them, and the webhook's serving
// certificate, which the operator makes, rotates and publishes itself.
package inject

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/hoplink/hoplink/api/v1alpha1"
)

const (
	// ContainerName is the injected relay's container; finding it in a pod
	// means the pod is injected already.
	ContainerName = "hoplink-relay"
	// AnnotationVersion records which operator version injected a pod, so
	// RelayNode status can count the pods an upgrade left outdated.
	AnnotationVersion = "hoplink.dev/sidecar-version"

	certsVolume = "hoplink-relay-certs"
	apiVolume   = "hoplink-relay-api"
	// CertsDir is where the sidecar reads its certificate files.
	CertsDir = "/var/run/hoplink/certs"
	// The API token path client-go's in-cluster config reads; a container
	// that already mounts something there is left alone by the
	// ServiceAccount admission plugin.
	apiDir   = "/var/run/secrets/kubernetes.io/serviceaccount"
	relayUID = 65532
)

// SignerName is the signer of sidecar relays' pod certificates (the
// operator runs it).
const SignerName = "hoplink.dev/relay"

// Config is what the operator knows that a pod and its RelayNode do not.
type Config struct {
	// PodCertificates gives each pod a certificate of its own through the
	// podCertificate projected volume (the cluster serves
	// PodCertificateRequests); otherwise the sidecar mounts the RelayNode's
	// certificate Secret.
	PodCertificates bool
	// Image of the relay unless the RelayNode names one.
	Image string
	// Version of the operator, written to AnnotationVersion.
	Version string
	// Resources of the sidecar unless the RelayNode sets its own.
	Resources *corev1.ResourceRequirements
}

// Container is the sidecar relay for a RelayNode in sidecar mode: a native
// sidecar (an init container that keeps running), so the pod's containers
// start once the relay is ready and Jobs complete when their work does.
func Container(rn *v1alpha1.RelayNode, c Config) corev1.Container {
	image := rn.Spec.Image
	if image == "" {
		image = c.Image
	}
	port, mport := rn.Spec.RelayPort(), rn.Spec.MetricsPort()
	ready := func(period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(mport), Scheme: corev1.URISchemeHTTP}},
			PeriodSeconds: period, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: failures,
		}
	}
	ctr := corev1.Container{
		Name:          ContainerName,
		Image:         image,
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Args: []string{"relay", "--kube", "--name", rn.Name, "--certs", CertsDir,
			"--metrics-addr", MetricsAddr(mport)},
		Env: []corev1.EnvVar{
			{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}},
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
			PodIPEnv,
		},
		Ports: []corev1.ContainerPort{
			{Name: "hoplink-quic", ContainerPort: port, Protocol: corev1.ProtocolUDP},
			{Name: "hoplink-tls", ContainerPort: port, Protocol: corev1.ProtocolTCP},
			{Name: "hoplink-metrics", ContainerPort: mport, Protocol: corev1.ProtocolTCP},
		},
		// Ready means: certificate loaded, manifests applied, listeners
		// open. Never "peers connected": a pod must not wait on its peers.
		StartupProbe:   ready(1, 300),
		ReadinessProbe: ready(5, 3),
		VolumeMounts: []corev1.VolumeMount{
			{Name: certsVolume, MountPath: CertsDir, ReadOnly: true},
			{Name: apiVolume, MountPath: apiDir, ReadOnly: true},
		},
		SecurityContext: RelaySecurityContext(rn.Spec.TUN),
	}
	switch {
	case rn.Spec.Resources != nil:
		ctr.Resources = *rn.Spec.Resources.DeepCopy()
	case c.Resources != nil:
		ctr.Resources = *c.Resources.DeepCopy()
	}
	if rn.Spec.TUN {
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: tunVolume, MountPath: "/dev/net/tun"})
	}
	return ctr
}

// PodIPEnv gives a relay container its pod's IP, which MetricsAddr binds.
var PodIPEnv = corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}}

// MetricsAddr is a relay container's --metrics-addr: port on the pod's IP
// (PodIPEnv; brackets hold IPv4 and IPv6 alike), where the kubelet probes
// and Prometheus scrapes, rather than every address. On the host network
// the pod's IP is the node's: the metrics port is then not served on the
// node's loopback or its other interfaces, where processes and networks
// that have no business with it would reach it.
func MetricsAddr(port int32) string { return "[$(POD_IP)]:" + strconv.Itoa(int(port)) }

// RelaySecurityContext is a relay container's, in a DaemonSet pod or as a
// sidecar: not root, no capability, no privilege escalation, a read-only
// root and the runtime's default seccomp profile. With a TUN device it runs
// as root, because Kubernetes grants added capabilities only to root (a
// non-root process would get none in its effective set), with NET_ADMIN
// alone: creating a TUN device and setting its address and routes need
// nothing more.
func RelaySecurityContext(tun bool) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{
		RunAsNonRoot:             ptr.To(true),
		RunAsUser:                ptr.To[int64](relayUID),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if tun {
		sc.RunAsNonRoot, sc.RunAsUser = ptr.To(false), ptr.To[int64](0)
		sc.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
	}
	return sc
}

const tunVolume = "hoplink-dev-net-tun"

// Volumes are the sidecar's: the RelayNode's certificate Secret, and its
// own API token (the pod may not mount one, and the relay watches its
// RelayNode, Chains and Tunnels with the pod's service account).
func Volumes(rn *v1alpha1.RelayNode, c Config) []corev1.Volume {
	certs := corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: v1alpha1.RelayObjectName(rn.Name), DefaultMode: ptr.To[int32](0o440)}}
	if c.PodCertificates {
		// The pod's own key (made by the kubelet, never sent anywhere) and
		// the certificate the operator's signer issues for it, in the
		// files the Secret would have; only the CA comes from the Secret.
		certs = corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o440), Sources: []corev1.VolumeProjection{
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.RelayObjectName(rn.Name)},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{PodCertificate: &corev1.PodCertificateProjection{SignerName: SignerName, KeyType: "ECDSAP256",
				KeyPath: "tls.key", CertificateChainPath: "tls.crt"}},
		}}}
	}
	v := []corev1.Volume{
		{Name: certsVolume, VolumeSource: certs},
		{Name: apiVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			DefaultMode: ptr.To[int32](0o444),
			Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
					Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
			}}}},
	}
	if rn.Spec.TUN {
		v = append(v, corev1.Volume{Name: tunVolume, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/dev/net/tun", Type: ptr.To(corev1.HostPathCharDev)}}})
	}
	return v
}

// Injected reports whether pod has a sidecar relay already.
func Injected(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == ContainerName })
}

// Patch is the JSON patch that injects the sidecar into pod: the container
// first among the init containers (so it starts before the others), its
// volumes and the version annotation. Targeted operations only: the pod is
// never re-encoded, so fields this operator's types do not know survive.
// An injected pod gets no patch. Warnings name port clashes.
func Patch(pod *corev1.Pod, rn *v1alpha1.RelayNode, c Config) (ops []jsonpatch.Operation, warnings []string) {
	if Injected(pod) {
		return nil, nil
	}
	ctr := Container(rn, c)
	if len(pod.Spec.InitContainers) == 0 {
		ops = append(ops, jsonpatch.NewOperation("add", "/spec/initContainers", []corev1.Container{ctr}))
	} else {
		ops = append(ops, jsonpatch.NewOperation("add", "/spec/initContainers/0", ctr))
	}
	vols := Volumes(rn, c)
	if len(pod.Spec.Volumes) == 0 {
		ops = append(ops, jsonpatch.NewOperation("add", "/spec/volumes", vols))
	} else {
		for _, v := range vols {
			ops = append(ops, jsonpatch.NewOperation("add", "/spec/volumes/-", v))
		}
	}
	if pod.Annotations == nil {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{AnnotationVersion: c.Version}))
	} else {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations/"+escape(AnnotationVersion), c.Version))
	}
	return ops, portClashes(pod, ctr)
}

// portClashes names the pod's ports that the relay also binds.
func portClashes(pod *corev1.Pod, relay corev1.Container) []string {
	var out []string
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			for _, p := range c.Ports {
				for _, rp := range relay.Ports {
					proto := func(p corev1.Protocol) corev1.Protocol { return orDefault(p, corev1.ProtocolTCP) }
					if p.ContainerPort == rp.ContainerPort && proto(p.Protocol) == proto(rp.Protocol) {
						out = append(out, fmt.Sprintf("container %q port %d/%s clashes with the hoplink relay's %s port: set spec.listen.port on the RelayNode to another port (the relay uses it and the next one)",
							c.Name, p.ContainerPort, proto(p.Protocol), strings.TrimPrefix(rp.Name, "hoplink-")))
					}
				}
			}
		}
	}
	return out
}

func orDefault[T comparable](v, fallback T) T {
	var zero T
	if v == zero {
		return fallback
	}
	return v
}

// escape makes a map key a JSON pointer token (RFC 6901).
func escape(s string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(s) }
