package relay

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/hoplink/hoplink/measure"
)

// FuzzLinkTable reads what a peer answers to a link request: a length and
// JSON. It must never panic, never take more than its limit, and a table it
// takes must survive being sent on (encoded and read again) unchanged once
// it has been read once.
func FuzzLinkTable(f *testing.F) {
	var b bytes.Buffer
	writeFramed(&b, measure.MaxTableSize, &measure.Table{Relay: "la",
		Links:   []measure.Link{{To: "useast", Up: true, RTT: measure.Duration(3 * time.Millisecond), Loss: 0.1}},
		Targets: []measure.Target{{Tunnel: "default/t", Target: "10.0.0.1:80", Up: true}}})
	f.Add(b.Bytes())
	f.Add(binary.BigEndian.AppendUint32(nil, 1<<30))
	f.Add(append(binary.BigEndian.AppendUint32(nil, 17), `{"links":[{"rtt":"x"}]}`...))
	f.Fuzz(func(t *testing.T, in []byte) {
		var first measure.Table
		if err := readFramed(bytes.NewReader(in), measure.MaxTableSize, &first); err != nil {
			return
		}
		if len(in)-4 > measure.MaxTableSize {
			t.Fatalf("took a %d-byte table", len(in)-4)
		}
		var w bytes.Buffer
		if err := writeFramed(&w, 1<<30, &first); err != nil {
			t.Fatalf("a table read cannot be written: %v", err)
		}
		var second, third measure.Table
		if err := readFramed(&w, 1<<30, &second); err != nil {
			t.Fatalf("a table written cannot be read: %v", err)
		}
		w.Reset()
		writeFramed(&w, 1<<30, &second)
		if err := readFramed(&w, 1<<30, &third); err != nil || !reflect.DeepEqual(second, third) {
			t.Fatalf("table changes on its way through:\n%+v\n%+v (%v)", second, third, err)
		}
	})
}
