package clusterset

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// Service is one service of the clusterset: every cluster's export of
// namespace/name, merged as KEP 1645 says. The oldest export (then the
// lower cluster ID) decides every property that the exports disagree on,
// and each such disagreement is a conflict reported on every export.
type Service struct {
	Namespace, Name string
	// Spec is the ServiceImport's spec but its IPs, which each cluster
	// allocates for itself.
	Spec        mcsv1beta1.ServiceImportSpec
	Labels      map[string]string
	Annotations map[string]string
	// Exporters are the clusters that export it, oldest export first.
	Exporters []string
	// Serving[i] are the clusters that serve Spec.Ports[i]: their export
	// is of the import's type and has that port (name, protocol and
	// number). Only they get its traffic.
	Serving [][]string
	// Conflicts are the properties the exports disagree on (the KEP's
	// reasons), with what differs where.
	Conflicts       []mcsv1beta1.ServiceExportConditionReason
	ConflictMessage string
	// Lacking are the clusters that cannot import it: they have no
	// namespace of its name.
	Lacking []string

	exports map[string]*Export
}

// Key is the namespace/name of the service.
func (s *Service) Key() string { return s.Namespace + "/" + s.Name }

// Export is the export of the named cluster, or nil.
func (s *Service) Export(cluster string) *Export { return s.exports[cluster] }

// Merge merges the clusters' Reports into the clusterset's services, sorted
// by namespace/name. Every cluster that holds the same Reports gets the same
// services, whatever their order.
func Merge(reports []*Report) []*Service {
	byKey := map[string]*Service{}
	for _, r := range reports {
		for i := range r.Exports {
			e := &r.Exports[i]
			s := byKey[e.Key()]
			if s == nil {
				s = &Service{Namespace: e.Namespace, Name: e.Name, exports: map[string]*Export{}}
				byKey[e.Key()] = s
			}
			s.exports[r.Cluster] = e
		}
	}
	for _, r := range reports {
		for _, k := range r.Missing {
			if s := byKey[k]; s != nil {
				s.Lacking = append(s.Lacking, r.Cluster)
			}
		}
	}
	out := make([]*Service, 0, len(byKey))
	for _, s := range byKey {
		s.merge()
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *Service) int { return cmp.Compare(a.Key(), b.Key()) })
	return out
}

func (s *Service) merge() {
	s.Exporters = slices.Collect(maps.Keys(s.exports))
	slices.SortFunc(s.Exporters, func(a, b string) int {
		ea, eb := s.exports[a], s.exports[b]
		return cmp.Or(ea.Created.Time.Compare(eb.Created.Time), cmp.Compare(a, b))
	})
	slices.Sort(s.Lacking)
	oldest := s.exports[s.Exporters[0]]
	s.Spec = mcsv1beta1.ServiceImportSpec{
		Type:                  oldest.Type,
		SessionAffinity:       oldest.SessionAffinity,
		SessionAffinityConfig: oldest.SessionAffinityConfig.DeepCopy(),
		IPFamilies:            slices.Clone(oldest.IPFamilies),
		InternalTrafficPolicy: oldest.InternalTrafficPolicy,
		TrafficDistribution:   oldest.TrafficDistribution,
	}
	s.Labels, s.Annotations = maps.Clone(oldest.Labels), maps.Clone(oldest.Annotations)

	// What differs from the oldest export, and in which clusters.
	differs := map[mcsv1beta1.ServiceExportConditionReason][]string{}
	for _, c := range s.Exporters[1:] {
		e := s.exports[c]
		for _, d := range []struct {
			reason mcsv1beta1.ServiceExportConditionReason
			same   bool
		}{
			{mcsv1beta1.ServiceExportReasonTypeConflict, e.Type == oldest.Type},
			{mcsv1beta1.ServiceExportReasonPortConflict, samePorts(e.Ports, oldest.Ports)},
			{mcsv1beta1.ServiceExportReasonSessionAffinityConflict, e.SessionAffinity == oldest.SessionAffinity},
			{mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict, equality.Semantic.DeepEqual(e.SessionAffinityConfig, oldest.SessionAffinityConfig)},
			{mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict, equalPtr(e.InternalTrafficPolicy, oldest.InternalTrafficPolicy)},
			{mcsv1beta1.ServiceExportReasonTrafficDistributionConflict, equalPtr(e.TrafficDistribution, oldest.TrafficDistribution)},
			{mcsv1beta1.ServiceExportReasonLabelsConflict, maps.Equal(e.Labels, oldest.Labels)},
			{mcsv1beta1.ServiceExportReasonAnnotationsConflict, maps.Equal(e.Annotations, oldest.Annotations)},
		} {
			if !d.same {
				differs[d.reason] = append(differs[d.reason], c)
			}
		}
	}
	s.Conflicts = nil
	var parts []string
	for _, reason := range conflictOrder {
		if cs := differs[reason]; len(cs) > 0 {
			s.Conflicts = append(s.Conflicts, reason)
			parts = append(parts, fmt.Sprintf("%s in %s", conflictWords[reason], strings.Join(cs, ", ")))
		}
	}
	s.ConflictMessage = ""
	if len(parts) > 0 {
		s.ConflictMessage = fmt.Sprintf("the exports differ from the oldest, cluster %s's: %s; the ServiceImport takes cluster %s's, with the union of the ports whose names do not clash",
			s.Exporters[0], strings.Join(parts, "; "), s.Exporters[0])
	}
	s.mergePorts()
}

// conflictOrder is the order reasons are listed in.
var conflictOrder = []mcsv1beta1.ServiceExportConditionReason{
	mcsv1beta1.ServiceExportReasonTypeConflict,
	mcsv1beta1.ServiceExportReasonPortConflict,
	mcsv1beta1.ServiceExportReasonSessionAffinityConflict,
	mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict,
	mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict,
	mcsv1beta1.ServiceExportReasonTrafficDistributionConflict,
	mcsv1beta1.ServiceExportReasonLabelsConflict,
	mcsv1beta1.ServiceExportReasonAnnotationsConflict,
}

var conflictWords = map[mcsv1beta1.ServiceExportConditionReason]string{
	mcsv1beta1.ServiceExportReasonTypeConflict:                  "headless or not",
	mcsv1beta1.ServiceExportReasonPortConflict:                  "ports",
	mcsv1beta1.ServiceExportReasonSessionAffinityConflict:       "session affinity",
	mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict: "session affinity config",
	mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict: "internal traffic policy",
	mcsv1beta1.ServiceExportReasonTrafficDistributionConflict:   "traffic distribution",
	mcsv1beta1.ServiceExportReasonLabelsConflict:                "exported labels",
	mcsv1beta1.ServiceExportReasonAnnotationsConflict:           "exported annotations",
}

// mergePorts takes the union of the exports' ports, oldest export first: a
// port whose name (or protocol and number) an older export already took
// under other terms is left out. Each port is served by the exports of the
// import's type that have it exactly.
func (s *Service) mergePorts() {
	var ports []mcsv1beta1.ServicePort
	var serving [][]string
	for _, c := range s.Exporters {
		e := s.exports[c]
		for _, p := range e.Ports {
			i := slices.IndexFunc(ports, func(q mcsv1beta1.ServicePort) bool {
				return q.Name == p.Name || q.Protocol == p.Protocol && q.Port == p.Port
			})
			if i < 0 {
				ports = append(ports, *p.DeepCopy())
				serving = append(serving, nil)
				i = len(ports) - 1
			} else if !samePort(ports[i], p) {
				continue
			}
			if e.Type == s.Spec.Type {
				serving[i] = append(serving[i], c)
			}
		}
	}
	if ports == nil {
		ports = []mcsv1beta1.ServicePort{} // the API requires the field
	}
	s.Spec.Ports, s.Serving = ports, serving
}

func samePort(a, b mcsv1beta1.ServicePort) bool {
	return a.Name == b.Name && a.Protocol == b.Protocol && a.Port == b.Port && equalPtr(a.AppProtocol, b.AppProtocol)
}

// samePorts compares two exports' ports as sets.
func samePorts(a, b []mcsv1beta1.ServicePort) bool {
	if len(a) != len(b) {
		return false
	}
	for _, p := range a {
		if !slices.ContainsFunc(b, func(q mcsv1beta1.ServicePort) bool { return samePort(p, q) }) {
			return false
		}
	}
	return true
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// ConflictReason is the Conflict condition's reason: the reasons joined by
// commas, as the API says.
func (s *Service) ConflictReason() string {
	r := make([]string, len(s.Conflicts))
	for i, c := range s.Conflicts {
		r[i] = string(c)
	}
	return strings.Join(r, ",")
}
