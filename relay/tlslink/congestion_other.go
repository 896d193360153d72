//go:build !linux

package tlslink

import (
	"errors"
	"net"
)

var errNoCongestion = errors.New("no per-socket congestion control on this system")

func trySocketCongestion(string) (string, error) { return "", errNoCongestion }

func setSocketCongestion(uintptr, string) error { return errNoCongestion }

// SocketCongestion is "" where the kernel does not say.
func SocketCongestion(*net.TCPConn) string { return "" }

func setNotSentLowat(uintptr) error { return nil }
