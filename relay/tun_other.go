//go:build !linux

package relay

import (
	"errors"

	quicgo "github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/api/v1alpha1"
	"github.com/hoplink/hoplink/manifest"
	rquic "github.com/hoplink/hoplink/relay/quic"
)

func (r *Relay) openTUN(*v1alpha1.Tunnel, string) (func(), error) {
	return nil, errors.New("protocol tun needs a Linux relay")
}

type packetExit struct{}

func (r *Relay) packetExit(string) (*packetExit, error) {
	return nil, errors.New("protocol tun needs a Linux relay")
}

func (r *Relay) syncPacketExits(*manifest.Set)                            {}
func (r *Relay) closePacketExits()                                        {}
func (r *Relay) servePacketQUIC(*rquic.Conn, *quicgo.Stream, *packetExit) {}
func (r *Relay) servePacketTLS(end, *packetExit)                          {}
