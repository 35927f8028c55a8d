package proc

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	psnet "github.com/shirou/gopsutil/v4/net"
)

// ListenAddrs returns the local addresses of the TCP sockets listening on
// port, whoever owns them (the engine may run in the agent's own process
// in tests, or behind a port forwarder: the socket is what a gateway
// reaches). 0.0.0.0 or :: means every interface. On Linux it reads
// /proc/net/tcp and tcp6 of the agent's network namespace, which is cheap
// and needs no privilege; elsewhere it asks gopsutil. An empty list with
// no error means nothing listens on the port here.
func ListenAddrs(ctx context.Context, port int) ([]netip.AddrPort, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("port %d out of range", port)
	}
	if runtime.GOOS != "linux" {
		return listenAddrsPortable(ctx, port)
	}
	var out []netip.AddrPort
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		file, err := os.Open(f)
		if errors.Is(err, os.ErrNotExist) {
			continue // no IPv6 in this kernel
		}
		if err != nil {
			return nil, fmt.Errorf("list listening sockets: %w", err)
		}
		addrs, err := parseProcNetTCP(file, port)
		file.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		out = append(out, addrs...)
	}
	return out, nil
}

// tcpListen is the state column of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// parseProcNetTCP reads the listening sockets on port from the text of
// /proc/net/tcp or tcp6: "sl local_address rem_address st ...", addresses
// as hex words in the kernel's byte order, then ":" and the port in hex.
func parseProcNetTCP(r io.Reader, port int) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != tcpListen {
			continue
		}
		hexAddr, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			return nil, fmt.Errorf("local address %q is not ADDR:PORT", f[1])
		}
		p, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("local port %q: %w", hexPort, err)
		}
		if int(p) != port {
			continue
		}
		ip, err := kernelIP(hexAddr)
		if err != nil {
			return nil, err
		}
		out = append(out, netip.AddrPortFrom(ip, uint16(p)))
	}
	return out, sc.Err()
}

// kernelIP decodes an address of /proc/net/tcp: 8 hex digits for IPv4,
// 32 for IPv6, each 32-bit word printed in the kernel's byte order.
func kernelIP(s string) (netip.Addr, error) {
	raw, err := hex.DecodeString(s)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.Addr{}, fmt.Errorf("local address %q is not 8 or 32 hex digits", s)
	}
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	ip, _ := netip.AddrFromSlice(b)
	return ip.Unmap(), nil
}

func listenAddrsPortable(ctx context.Context, port int) ([]netip.AddrPort, error) {
	conns, err := psnet.ConnectionsWithContext(ctx, "tcp")
	if err != nil {
		return nil, fmt.Errorf("list tcp sockets: %w", err)
	}
	var out []netip.AddrPort
	for _, c := range conns {
		if c.Status != "LISTEN" || c.Laddr.Port != uint32(port) {
			continue
		}
		if ip, err := netip.ParseAddr(c.Laddr.IP); err == nil {
			ap := netip.AddrPortFrom(ip.Unmap(), uint16(port))
			if !slices.Contains(out, ap) {
				out = append(out, ap)
			}
		}
	}
	return out, nil
}
