package controllers

import (
	"testing"

	"k8s.io/apimachinery/pkg/version"
)

func TestBufferSysctlsAllowed(t *testing.T) {
	for _, tc := range []struct {
		git  string
		want bool
	}{
		{"v1.37.1", true},
		{"v1.35.0", true},
		{"v1.35.2-gke.1100", true},
		{"v1.34.9", false}, // a 1.31 kubelet may serve it
		{"v1.28.0", false},
		{"", false},
		{"garbage", false},
	} {
		if got := BufferSysctlsAllowed(&version.Info{GitVersion: tc.git}); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.git, got, tc.want)
		}
	}
	if BufferSysctlsAllowed(nil) {
		t.Error("no version: allowed")
	}
}
