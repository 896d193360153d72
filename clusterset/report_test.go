package clusterset

import (
	"bytes"
	"compress/gzip"
	"reflect"
	"strings"
	"testing"
)

func gz(t testing.TB, s string) []byte {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	z.Write([]byte(s))
	z.Close()
	return b.Bytes()
}

func TestDecodeRefuses(t *testing.T) {
	good, err := Encode(hello("a", t0, nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(good); err != nil {
		t.Fatalf("a good report: %v", err)
	}
	for _, tc := range []struct{ name, json, want string }{
		{"not a DNS label", `{"cluster":"A_1","gateway":"g","local":["g"],"known":["g"]}`, "cluster"},
		{"gateway not its own", `{"cluster":"a","gateway":"x","local":["g"],"known":["g"]}`, "gateway"},
		{"unknown field", `{"cluster":"a","gateway":"g","local":["g"],"known":["g"],"extra":1}`, "unknown field"},
		{"bad address", `{"cluster":"a","gateway":"g","local":["g"],"known":["g"],"exports":[{"namespace":"n","name":"s","type":"ClusterSetIP","address":"nope"}]}`, "address"},
		{"bad type", `{"cluster":"a","gateway":"g","local":["g"],"known":["g"],"exports":[{"namespace":"n","name":"s","type":"NodePort"}]}`, "type"},
		{"twice", `{"cluster":"a","gateway":"g","local":["g"],"known":["g"],"exports":[{"namespace":"n","name":"s","type":"Headless"},{"namespace":"n","name":"s","type":"Headless"}]}`, "twice"},
		{"trailing", `{"cluster":"a","gateway":"g","local":["g"],"known":["g"]} {}`, "after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(gz(t, tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one about %q", err, tc.want)
			}
		})
	}
	// A gzip bomb stops at MaxDecoded.
	if _, err := Decode(gz(t, `{"cluster":"`+strings.Repeat("a", MaxDecoded+10))); err == nil || !strings.Contains(err.Error(), "inflates") {
		t.Errorf("a bomb: %v", err)
	}
}

// FuzzDecode: whatever Decode accepts encodes again to a report that
// decodes to the same, and merges without a panic.
func FuzzDecode(f *testing.F) {
	good, _ := Encode(hello("a", t0, nil))
	f.Add(good)
	f.Add(gz(f, `{"cluster":"a","gateway":"g","local":["g"],"known":["g"],"exports":[{"namespace":"n","name":"s","type":"Headless","endpoints":[{"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.1"],"hostname":"h","ready":true}]}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			return
		}
		again, err := Encode(r)
		if err != nil {
			return // too large once encoded again: refused, not broken
		}
		r2, err := Decode(again)
		if err != nil {
			t.Fatalf("a report Decode accepted does not decode again: %v", err)
		}
		if !reflect.DeepEqual(r, r2) {
			t.Fatalf("decoded again differently:\n%+v\n%+v", r, r2)
		}
		svcs := Merge([]*Report{r})
		Chains("edge", []*Report{r})
		Tunnels("edge", []*Report{r}, svcs)
		for _, s := range svcs {
			EndpointSlices(s, Sources{Self: "x", Gateway: []GatewayPod{{Address: "10.0.0.9", Ready: true}}})
		}
	})
}
