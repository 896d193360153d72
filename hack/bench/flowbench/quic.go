package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/hoplink/hoplink/pki"
)

// The floor of a hop: what bare quic-go and bare TCP take for one small
// round trip between two processes on this machine. A relay hop cannot be
// faster than its transport's round trip, so these rows bound what the time
// to first byte of a chain can reach.

const benchALPN = "hoplink-bench"

// quicEcho accepts QUIC connections on addr and echoes each stream.
func quicEcho(addr string) error {
	// A throwaway certificate: the bench measures transport latency, not trust.
	ca, err := pki.NewCA("flowbench")
	if err != nil {
		return err
	}
	id, err := ca.Identity("flowbench")
	if err != nil {
		return err
	}
	ln, err := quic.ListenAddr(addr, &tls.Config{Certificates: []tls.Certificate{*id.Certificate()}, NextProtos: []string{benchALPN}},
		bulkWindows(&quic.Config{MaxIncomingStreams: 1 << 16}))
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept(context.Background())
		if err != nil {
			return err
		}
		// A unidirectional stream is a sink for quicBulk.
		go func() {
			for {
				s, err := c.AcceptUniStream(context.Background())
				if err != nil {
					return
				}
				go io.Copy(io.Discard, s)
			}
		}()
		go func() {
			for {
				s, err := c.AcceptStream(context.Background())
				if err != nil {
					return
				}
				go func() {
					buf := make([]byte, 4096)
					io.CopyBuffer(struct{ io.Writer }{s}, struct{ io.Reader }{s}, buf)
					s.Close()
				}()
			}
		}()
	}
}

// quicRTT opens one connection to a quicEcho, then n streams one after
// another; each writes one byte and waits for its echo, as a new flow does
// on a relay's warm link.
func quicRTT(addr string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The bench measures transport latency, not trust: the echo's
	// certificate is throwaway.
	c, err := quic.DialAddr(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{benchALPN}}, &quic.Config{})
	if err != nil {
		return err
	}
	defer c.CloseWithError(0, "")
	lat := make([]time.Duration, 0, n)
	b := []byte{1}
	for range n {
		start := time.Now()
		s, err := c.OpenStreamSync(ctx)
		if err != nil {
			return err
		}
		if _, err := s.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(s, b); err != nil {
			return fmt.Errorf("no echo: %w", err)
		}
		lat = append(lat, time.Since(start))
		s.Close()
	}
	printStats("quic_rtt", lat, "")
	return nil
}

// tcpRTT sends one byte at a time over one open connection to an echo.
func tcpRTT(addr string, n int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	lat := make([]time.Duration, 0, n)
	b := []byte{1}
	for range n {
		start := time.Now()
		if _, err := c.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		lat = append(lat, time.Since(start))
	}
	printStats("tcp_rtt", lat, "")
	return nil
}

// bulkWindows gives a bare quic-go connection the flow-control windows a
// relay's have (relay/quic), so a bulk figure compares like with like.
func bulkWindows(c *quic.Config) *quic.Config {
	c.InitialStreamReceiveWindow, c.MaxStreamReceiveWindow = 1<<20, 16<<20
	c.InitialConnectionReceiveWindow, c.MaxConnectionReceiveWindow = 4<<20, 64<<20
	return c
}

// quicBulk writes into one stream to a quicEcho for d and prints what it
// carried: bare quic-go's bulk throughput between two processes, the most a
// QUIC hop could carry here with no relay work around it. A write returns
// once quic-go has taken the bytes, so the figure runs ahead of the
// receiver by at most one stream window (16 MiB, 27 Mbit/s over 5 s).
func quicBulk(addr string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer cancel()
	c, err := quic.DialAddr(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{benchALPN}}, bulkWindows(&quic.Config{}))
	if err != nil {
		return err
	}
	defer c.CloseWithError(0, "")
	s, err := c.OpenUniStreamSync(ctx)
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	var sent int64
	start := time.Now()
	for time.Since(start) < d {
		n, err := s.Write(buf)
		sent += int64(n)
		if err != nil {
			return err
		}
	}
	fmt.Printf("quic_bulk gbps=%.2f\n", float64(sent)*8/time.Since(start).Seconds()/1e9)
	return nil
}
